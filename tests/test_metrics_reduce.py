"""Per-rank metrics reduced the way trainers read them, and the padding-aware row count a worker normalises by.

``reduce_metrics`` is property-tested on its own (any number of ranks, any
values); ``reduce_metrics_mode`` on local groups of 1-4 ranks with batches
of any length (padding included), and once on self-started torchrun.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dispatchcore import (
    PADDING_ROWS_KEY,
    DataProto,
    Dispatch,
    DispatchTypeError,
    RegistrationError,
    Worker,
    WorkerGroup,
    real_rows,
    reduce_metrics,
    reduce_metrics_mode,
    register,
)

NAMES = st.sampled_from(["loss", "grad_norm", "lr", "entropy"])
NUMBERS = st.one_of(st.integers(-(10**6), 10**6), st.floats(-1e6, 1e6, allow_nan=False))
PER_RANK = st.lists(st.dictionaries(NAMES, st.one_of(NUMBERS, st.lists(NUMBERS, max_size=3))), min_size=1, max_size=8)


def _flat(per_rank: list[dict[str, Any]], name: str) -> list[Any]:
    out: list[Any] = []
    for metrics in per_rank:
        value = metrics.get(name, [])
        out.extend(value if isinstance(value, list) else [value])
    return out


@given(PER_RANK)
def test_each_reduction_over_any_ranks(per_rank: list[dict[str, Any]]) -> None:
    names = {n for m in per_rank for n in m if _flat(per_rank, n)}
    got = {how: reduce_metrics(per_rank, how) for how in ("mean", "sum", "max", "min")}
    for how, reduced in got.items():
        assert set(reduced) == names, how
    for name in names:
        values = _flat(per_rank, name)
        assert got["max"][name] == max(values) and got["min"][name] == min(values)
        slack = 1e-9 * max(1.0, abs(got["mean"][name]))  # fsum / len rounds once
        assert got["min"][name] - slack <= got["mean"][name] <= got["max"][name] + slack
        assert math.isclose(got["sum"][name], math.fsum(values), rel_tol=1e-12, abs_tol=1e-6)
        assert math.isclose(got["mean"][name] * len(values), got["sum"][name], rel_tol=1e-9, abs_tol=1e-6)
        if all(isinstance(v, int) for v in values):
            assert got["sum"][name] == sum(values) and isinstance(got["sum"][name], int)


@given(PER_RANK, st.dictionaries(NAMES, st.sampled_from(["mean", "sum", "max", "min"])))
def test_dict_of_lists_and_per_rank_dicts_agree_and_a_mapping_picks_per_name(
    per_rank: list[dict[str, Any]], how: dict[str, str]
) -> None:
    """``DataProto.concat``'s ``{name: [per rank]}`` and ``DP_COMPUTE_METRIC``'s ``[{name: v}]`` reduce alike."""
    merged: dict[str, list[Any]] = {}
    for metrics in per_rank:
        for name, value in metrics.items():
            merged.setdefault(name, []).append(value)
    assert reduce_metrics(merged, how) == reduce_metrics(per_rank, how)
    for name, value in reduce_metrics(per_rank, how).items():
        assert value == reduce_metrics(per_rank, how.get(name, "mean"))[name]


def test_tensors_arrays_and_a_function_are_taken_and_a_bad_value_is_named() -> None:
    per_rank = [{"loss": torch.tensor(1.0), "acc": np.float32(0.5)}, {"loss": torch.tensor([2.0, 3.0]), "acc": 1}]
    assert reduce_metrics(per_rank) == {"loss": 2.0, "acc": 0.75}
    assert reduce_metrics(per_rank, {"loss": len}) == {"loss": 3, "acc": 0.75}
    assert math.isnan(reduce_metrics([{"x": 1.0}, {"x": math.nan}], "max")["x"])
    with pytest.raises(DispatchTypeError, match="'loss' is a str"):
        reduce_metrics([{"loss": "high"}])
    with pytest.raises(RegistrationError, match="'median'"):
        reduce_metrics_mode("median")


def test_real_rows_reads_the_padding_mark() -> None:
    data = DataProto.from_dict({"x": torch.arange(7)}, auto_padding=True)
    chunks = data.chunk(4)  # 7 rows over 4: 2, 2, 2 and 1 + one padding row
    assert [real_rows(c) for c in chunks] == [2, 2, 2, 1]
    assert [c.meta_info[PADDING_ROWS_KEY] for c in chunks] == [0, 0, 0, 1]
    assert real_rows(DataProto.from_dict({"x": torch.arange(3)})) == 3


# -- in modes, on groups ---------------------------------------------------------------------------


class Metrics(Worker):
    @register(dispatch_mode=reduce_metrics_mode({"rows": "sum", "seen": "sum", "rank_max": "max", "rank_min": "min"}))
    def count(self, data: DataProto) -> dict[str, Any]:
        return {"rows": real_rows(data), "seen": len(data), "rank_max": self.rank, "rank_min": self.rank}

    @register(dispatch_mode=reduce_metrics_mode({"loss": "mean", "rows": "sum"}, Dispatch.DP_COMPUTE_PROTO))
    def update(self, data: DataProto) -> DataProto:
        n = real_rows(data)
        loss = float(data.batch["x"][:n].float().sum())  # padding rows left out
        out = DataProto.from_dict({"y": data.batch["x"] * 2})
        out.meta_info["metrics"] = {"loss": loss, "rows": n}
        return out

    @register(dispatch_mode=reduce_metrics_mode("sum", Dispatch.DP_COMPUTE_PROTO), blocking=False)
    def update_later(self, data: DataProto) -> DataProto:
        out = DataProto.from_dict({"y": data.batch["x"]})
        out.meta_info["metrics"] = {"rows": real_rows(data)}
        return out

    @register(dispatch_mode=Dispatch.DP_COMPUTE_METRIC)
    def plain(self, data: DataProto) -> dict[str, int]:
        return {"rows": real_rows(data)}

    @register(dispatch_mode=reduce_metrics_mode("max", Dispatch.ONE_TO_ALL))
    def slowest(self) -> float:
        return float(self.rank)


@pytest.fixture(scope="module")
def local_groups() -> Iterator[dict[int, WorkerGroup[Metrics]]]:
    groups = {n: WorkerGroup(Metrics, n, backend="local") for n in range(1, 5)}
    yield groups
    for wg in groups.values():
        wg.shutdown()


def _check_group(wg: WorkerGroup[Metrics], length: int) -> None:
    n = wg.world_size
    batch = DataProto.from_dict({"x": torch.arange(length)}, auto_padding=True)
    counted = wg.count(batch)
    padded = length + (-length) % n
    assert counted == {"rows": length, "seen": padded, "rank_max": n - 1, "rank_min": 0}
    out = wg.update(batch)
    assert torch.equal(out.batch["y"], torch.arange(length) * 2)
    assert out.meta_info["metrics"]["rows"] == length
    size = padded // n
    sums = [float(torch.arange(length)[r * size : min((r + 1) * size, length)].sum()) for r in range(n)]
    assert out.meta_info["metrics"]["loss"] == pytest.approx(sum(sums) / n)
    assert wg.plain(batch) == [{"rows": max(0, min(size, length - r * size))} for r in range(n)]  # default: a list
    assert wg.slowest() == n - 1
    assert wg.update_later(batch).get().meta_info["metrics"] == {"rows": length}  # a future's collect too


@settings(max_examples=20, deadline=None)
@given(st.integers(1, 4), st.integers(1, 23))
def test_reduced_modes_on_local_any_world_size_and_batch(local_groups: Any, n: int, length: int) -> None:
    _check_group(local_groups[n], length)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_reduced_modes_on_torchrun() -> None:
    with WorkerGroup(Metrics, 2, backend="torchrun") as wg:
        for length in (1, 5, 6):
            _check_group(wg, length)
