"""DataProto <-> TensorDict conversion keeps nested, ragged and empty non-tensor rows.

An agent loop fills object columns with per-row lists (often empty) and
dicts; tensordict's ``NonTensorStack.from_list`` turns such lists into nested
stacks that break ``.data`` reads, so these tests pin the exact round trip.
They need tensordict and skip only where it is not installed.
"""

from __future__ import annotations

import sys
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dispatchcore import DataProto
from dispatchcore.testing.strategies import assert_dataproto_equal, dataprotos, meta_infos

FAST = settings(deadline=None, max_examples=40, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(scope="module")
def tdm() -> ModuleType:
    """The tensordict module; the guard that skips where it is not installed."""
    return pytest.importorskip("tensordict")


def objects(values: list[Any]) -> np.ndarray:
    """A 1-D object column holding ``values`` as they are (numpy must not unpack lists)."""
    column = np.empty(len(values), dtype=object)
    for i, value in enumerate(values):
        column[i] = value
    return column


def assert_same_types(actual: Any, expected: Any) -> None:
    """Values equal is not enough: a tuple must stay a tuple, an int an int."""
    assert type(actual) is type(expected), f"{actual!r} ({type(actual).__name__}) vs {expected!r}"
    if isinstance(expected, np.ndarray):
        assert actual.dtype == expected.dtype and actual.shape == expected.shape
        if expected.dtype == object:
            for a, e in zip(actual.flat, expected.flat, strict=True):
                assert_same_types(a, e)
    elif isinstance(expected, list | tuple):
        for a, e in zip(actual, expected, strict=True):
            assert_same_types(a, e)
    elif isinstance(expected, dict):
        assert list(actual) == list(expected)
        for key in expected:
            assert_same_types(actual[key], expected[key])


def round_trip(data: DataProto) -> DataProto:
    """``to_tensordict`` then ``from_tensordict``, checked to be exact."""
    back = DataProto.from_tensordict(data.to_tensordict())
    assert_dataproto_equal(back, data)
    for key, column in data.non_tensor_batch.items():
        assert_same_types(back.non_tensor_batch[key], column)
    assert_same_types(back.meta_info, data.meta_info)
    return back


def agent_batch() -> DataProto:
    """Rows as an agent loop leaves them: ragged turns, empty tool calls, None."""
    return DataProto.from_dict(
        tensors={"ids": torch.arange(8).reshape(4, 2)},
        non_tensors={
            "messages": objects(
                [
                    [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}],
                    [],
                    [{"role": "user", "content": "x", "tool_calls": []}],
                    [],
                ]
            ),
            "tool_calls": objects([[], [], [], []]),
            "turn_ids": objects([[1, 2, 3], [], [4], [5, 6]]),
            "extra": objects([{"k": [1, []]}, {}, None, ("a", 1)]),
            "text": objects(["a", "", "b", "a"]),
        },
        meta_info={"temperature": 0.7},
    )


# -- regressions -------------------------------------------------------------------


def test_nested_ragged_and_empty_list_rows_round_trip(tdm: ModuleType) -> None:
    data = agent_batch()
    td = data.to_tensordict()
    assert isinstance(td["ids"], torch.Tensor)
    for key in data.non_tensor_batch:
        entry = td.get(key)
        assert isinstance(entry, tdm.NonTensorStack) and entry.batch_size == torch.Size([4]), key
    round_trip(data)


@pytest.mark.parametrize("n", [1, 2, 5])
def test_a_column_of_only_empty_lists_round_trips(tdm: ModuleType, n: int) -> None:
    round_trip(DataProto.from_dict(non_tensors={"calls": objects([[] for _ in range(n)])}))


@pytest.mark.parametrize(
    "rows",
    [[[1, 2], [], [3]], [[], []], [[], [1]], [[1], []], [["a", "b"], ["c"]]],
    ids=["ragged", "all-empty", "empty-first", "empty-last", "strings"],
)
def test_reads_the_nested_stacks_from_list_builds(tdm: ModuleType, rows: list[list[Any]]) -> None:
    """``NonTensorStack.from_list`` nests list rows; reading them once raised IndexError."""
    td = tdm.TensorDict({"x": torch.arange(len(rows))}, batch_size=[len(rows)])
    td["rows"] = tdm.NonTensorStack.from_list(rows)
    data = DataProto.from_tensordict(td)
    column = data.non_tensor_batch["rows"]
    assert column.dtype == object and column.shape == (len(rows),)
    assert column.tolist() == rows


def test_identical_rows_stay_a_column(tdm: ModuleType) -> None:
    """Equal values in every row are a column, not meta info."""
    round_trip(
        DataProto.from_dict(
            non_tensors={"same": objects(["a", "a", "a"]), "none": objects([None] * 3), "lists": objects([[]] * 3)}
        )
    )


def test_meta_info_round_trips_next_to_columns(tdm: ModuleType) -> None:
    data = agent_batch()
    data.meta_info.update(
        {
            "metrics": {"loss": [0.5, 0.25], "lr": [1e-5]},
            "nested": {"a": [1, {"b": ()}], "empty": []},
            "none": None,
            "name": "step",
            "count": 3,
            "flag": False,
        }
    )
    round_trip(data)


def test_meta_info_tensor_value_round_trips(tdm: ModuleType) -> None:
    data = DataProto.from_dict(non_tensors={"text": objects(["a"])}, meta_info={"scale": torch.tensor([1.0, 2.0])})
    back = round_trip(data)
    assert torch.equal(back.meta_info["scale"], data.meta_info["scale"])


def test_from_tensordict_merges_the_meta_info_argument(tdm: ModuleType) -> None:
    td = agent_batch().to_tensordict()
    back = DataProto.from_tensordict(td, meta_info={"extra": 1, "temperature": 0.0})
    assert back.meta_info == {"extra": 1, "temperature": 0.7}


@pytest.mark.parametrize("n", [0, 1])
def test_zero_and_one_rows(tdm: ModuleType, n: int) -> None:
    round_trip(
        DataProto.from_dict(
            tensors={"t": torch.zeros(n, 3)},
            non_tensors={"rows": objects([[1, []]] * n), "uid": np.arange(n, dtype=np.int32)},
            meta_info={"m": [1]},
        )
    )


def test_only_meta_info(tdm: ModuleType) -> None:
    round_trip(DataProto(meta_info={"a": 1, "b": [None]}))


def test_non_object_and_multi_dim_columns_keep_dtype_and_shape(tdm: ModuleType) -> None:
    grid = np.empty((3, 2), dtype=object)
    grid[:] = [[[1], []], [None, "x"], [{"a": 1}, ()]]
    round_trip(
        DataProto.from_dict(
            tensors={"t": torch.arange(3)},
            non_tensors={
                "uid": np.array([7, 8, 9], dtype=np.int32),
                "name": np.array(["ab", "c", ""]),
                "pairs": np.arange(6.0).reshape(3, 2),
                "grid": grid,
                "arrays": objects([np.arange(2), np.arange(2), np.arange(2)]),
                "scalars": objects([np.int64(1), np.float32(2.0), 3]),
            },
        )
    )


def test_slicing_or_concatenating_the_tensordict_matches_the_dataproto(tdm: ModuleType) -> None:
    data = agent_batch()
    data.non_tensor_batch["uid"] = np.arange(4, dtype=np.int32)
    td = data.to_tensordict()
    assert_dataproto_equal(DataProto.from_tensordict(td[1:3]), data[1:3])
    assert_dataproto_equal(DataProto.from_tensordict(torch.cat([td, td])), DataProto.concat([data, data]))


def test_to_tensordict_refuses_shared_keys(tdm: ModuleType) -> None:
    data = DataProto.from_dict(tensors={"x": torch.zeros(2)}, non_tensors={"y": objects([1, 2])}, meta_info={"y": 0})
    with pytest.raises(ValueError, match=r"\['y'\]"):
        data.to_tensordict()
    data = DataProto.from_dict(non_tensors={"y": objects([1, 2])}, meta_info={"_dispatchcore_column_layout": 0})
    with pytest.raises(ValueError, match="reserved"):
        data.to_tensordict()


def test_from_tensordict_refuses_other_inputs(tdm: ModuleType) -> None:
    with pytest.raises(TypeError, match="dict"):
        DataProto.from_tensordict({"x": torch.zeros(2)})
    with pytest.raises(ValueError, match="num_batch_dims"):
        DataProto.from_tensordict(tdm.TensorDict({}, batch_size=[0]), num_batch_dims=2)


def test_missing_tensordict_names_the_pip_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs with tensordict installed too: a None entry in sys.modules blocks the import."""
    monkeypatch.setitem(sys.modules, "tensordict", None)
    with pytest.raises(ImportError, match="pip install tensordict"):
        agent_batch().to_tensordict()
    with pytest.raises(ImportError, match="pip install tensordict"):
        DataProto.from_tensordict(None)


# -- properties --------------------------------------------------------------------

_LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**40), 2**40),
    st.floats(allow_nan=False, width=32),
    st.text(max_size=4),
)
_NESTED = st.recursive(
    _LEAVES,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.tuples(inner, inner),
        st.dictionaries(st.text(max_size=3), inner, max_size=3),
    ),
    max_leaves=8,
)
_ROW_KINDS = {
    "ragged_ints": st.lists(st.integers(-5, 5), max_size=4),
    "dicts": st.dictionaries(st.text(max_size=3), st.lists(st.integers(), max_size=2), max_size=3),
    "nested": _NESTED,
}


@st.composite
def object_batches(draw: st.DrawFn) -> DataProto:
    """0-6 rows; each drawn column holds one kind of row value (ragged lists, dicts, anything)."""
    n = draw(st.integers(0, 6))
    kinds = draw(st.lists(st.sampled_from(sorted(_ROW_KINDS)), min_size=1, max_size=3, unique=True))
    non_tensors = {kind: objects(draw(st.lists(_ROW_KINDS[kind], min_size=n, max_size=n))) for kind in kinds}
    tensors = {"t": torch.arange(n)} if draw(st.booleans()) else {}
    return DataProto.from_dict(tensors, non_tensors, draw(meta_infos()))


@FAST
@given(data=object_batches())
def test_object_columns_round_trip(tdm: ModuleType, data: DataProto) -> None:
    round_trip(data)


@FAST
@given(data=dataprotos(max_len=8, with_non_tensors=None))
def test_dataprotos_round_trip(tdm: ModuleType, data: DataProto) -> None:
    round_trip(data)


@FAST
@given(data=object_batches(), bounds=st.tuples(st.integers(0, 6), st.integers(0, 6)))
def test_slicing_commutes_with_conversion(tdm: ModuleType, data: DataProto, bounds: tuple[int, int]) -> None:
    start, stop = sorted(bounds)
    start, stop = min(start, len(data)), min(stop, len(data))
    assert_dataproto_equal(DataProto.from_tensordict(data.to_tensordict()[start:stop]), data[start:stop])
