"""Hold a dispatch mode (yours or a built-in one) to the properties every data-parallel mode keeps.

A bug in a mode's two driver-side functions loses rows, reorders results or
leaks padding, silently.  The checker runs the mode through :func:`dispatchcore.direct_call`
(no group, no ranks), lets each rank echo its chunk, collects, and checks :data:`PROPERTIES`:

* ``dispatch``: the batch is taken and every rank receives a DataProto;
* ``padding``: each chunk's ``meta_info["padding_rows"]`` counts its trailing
  repeated rows, and the result carries no padding (rows nor key);
* ``dropped_rows``: every input row reaches a rank as a real row and comes back;
* ``order``: rows come back in input order;
* ``round_trip``: the result equals the input (or, ``collects="per_rank"``,
  output ``r`` is rank ``r``'s; ``collects=sum``, the reduction of the outputs);
* ``caller_unchanged``: the caller's batch is left as it was.

A broken property raises :class:`ModePropertyError`.  Usage: docs/testing.md.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import numpy as np
import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from dispatchcore import PADDING_ROWS_KEY, BatchSizeError, DataProto, DispatchValueError, direct_call

from . import strategies
from .assertions import assert_dataproto_equal

__all__ = ["PROPERTIES", "ROW_ID", "ModePropertyError", "assert_mode_properties", "check_dispatch_mode"]

#: The column the checker adds: each row's position in the input batch.
ROW_ID = "_dispatchcore_row_id"

#: The properties checked, in the order they are checked.
PROPERTIES = ("dispatch", "padding", "dropped_rows", "order", "round_trip", "caller_unchanged")

Mesh = Mapping[str, Sequence[tuple[int, bool]]]
#: How the caller's result is made: rows joined back, the per-rank list, or a reduction of the outputs.
Collects = Literal["rows", "per_rank"] | Callable[[list[Any]], Any]
_Fail = Callable[[str, str], "ModePropertyError"]


class ModePropertyError(AssertionError):
    """A dispatch mode broke a property; ``.property``, ``.world_size`` and ``.batch`` say which and where."""

    def __init__(self, mode: str, prop: str, world_size: int, batch: DataProto, detail: str) -> None:
        self.mode = mode
        self.property = prop
        self.world_size = world_size
        self.batch = batch
        self.detail = detail
        super().__init__(
            f"dispatch mode {mode!r} breaks {prop!r} at world_size={world_size} on {describe_batch(batch)}: {detail}"
        )


def describe_batch(data: DataProto) -> str:
    """One line naming a batch's length, padding flag, columns (dtype and shape) and meta keys."""
    columns = [
        f"{k} {str(t.dtype).removeprefix('torch.')}{list(t.shape)}"
        for k, t in (data.batch.items() if data.batch is not None else ())
        if k != ROW_ID
    ]
    columns += [f"{k} numpy {a.dtype}{list(a.shape)}" for k, a in data.non_tensor_batch.items()]
    meta = sorted(k for k in data.meta_info if k != PADDING_ROWS_KEY)
    return (
        f"a batch of {len(data)} rows (auto_padding={data.is_padding_enabled()}; "
        f"columns: {', '.join(columns) or 'none'}; meta keys: {meta})"
    )


def _mode_name(mode: Any) -> str:
    return str(getattr(mode, "name", None) or (mode.get("name") if isinstance(mode, dict) else None) or repr(mode))


def _with_row_ids(data: DataProto) -> DataProto:
    tensors = dict(data.batch.items()) if data.batch is not None else {}
    tensors[ROW_ID] = torch.arange(len(data), dtype=torch.int64)
    return DataProto(tensors, dict(data.non_tensor_batch), dict(data.meta_info))


def _split_count(world_size: int, mesh: Mesh | None) -> int:
    """How many distinct chunks an even split makes: dp size on a mesh, else the world size."""
    if not mesh:
        return world_size
    return max(len({dp for dp, _ in layout}) for layout in mesh.values())


def assert_mode_properties(
    mode: Any,
    data: DataProto,
    world_size: int,
    *,
    mesh: Mesh | None = None,
    keyword: str | None = None,
    leading_args: Sequence[Any] = (),
    collects: Collects = "rows",
    outputs: Sequence[Any] | None = None,
) -> None:
    """Check every property of :data:`PROPERTIES` for one batch at one world size.

    ``mode``: anything ``@register`` takes.  The batch goes in after
    ``leading_args``, or as keyword ``keyword``.  ``mesh``: each rank's
    ``(dp_rank, is_collect)`` per mesh name, for nd modes.  With a reducing
    ``collects``, rank ``r`` returns ``outputs[r]`` (default ``2**r``).
    """
    if not callable(collects) and collects not in ("rows", "per_rank"):
        raise DispatchValueError(f"collects must be 'rows', 'per_rank' or a reducing function (sum), got {collects!r}")
    name = _mode_name(mode)

    def fail(prop: str, detail: str) -> ModePropertyError:
        return ModePropertyError(name, prop, world_size, data, detail)

    sent = _with_row_ids(data)
    before = copy.deepcopy(sent)
    args = tuple(leading_args) if keyword is not None else (*leading_args, sent)
    kwargs = {keyword: sent} if keyword is not None else {}
    try:
        call = direct_call(mode, world_size, args, kwargs, mesh=mesh)
    except BatchSizeError as exc:
        if not data.is_padding_enabled() and len(data) % _split_count(world_size, mesh):
            return  # an uneven batch without padding may be refused, with BatchSizeError
        raise fail("dispatch", f"refused the batch with BatchSizeError: {exc}") from exc
    except Exception as exc:
        raise fail("dispatch", f"dispatch raised {type(exc).__name__}: {exc}") from exc

    chunks = _received_chunks(call, world_size, fail)
    _check_chunks(chunks, len(data), fail)

    if callable(collects):
        _check_reduced(call, collects, [2**r for r in range(world_size)] if outputs is None else outputs, fail)
    else:
        try:
            result = call.collect(list(chunks))  # every rank echoes its chunk
        except Exception as exc:
            raise fail("round_trip", f"collect raised {type(exc).__name__}: {exc}") from exc
        if collects == "per_rank":
            _check_per_rank(result, chunks, fail)
        else:
            _check_rows(result, sent, fail)
    try:
        assert_dataproto_equal(sent, before)
    except AssertionError as exc:
        raise fail("caller_unchanged", f"dispatch or collect changed the caller's batch: {exc}") from None


def _received_chunks(call: Any, world_size: int, fail: _Fail) -> list[DataProto]:
    """The DataProto each rank receives, by position or by keyword, whichever way the mode passes it on."""
    chunks = []
    for rank in range(world_size):
        rank_args, rank_kwargs = call.inputs(rank)
        chunk = next((v for v in (*rank_args, *rank_kwargs.values()) if isinstance(v, DataProto)), None)
        if chunk is None:
            got = [type(v).__name__ for v in (*rank_args, *rank_kwargs.values())]
            raise fail("dispatch", f"rank {rank} received no DataProto (its arguments: {got})")
        chunks.append(chunk)
    return chunks


def _row_ids(chunk: DataProto) -> list[int] | None:
    if chunk.batch is None or ROW_ID not in chunk.batch.keys():
        return None
    return [int(i) for i in chunk.batch[ROW_ID].tolist()]


def _check_chunks(chunks: list[DataProto], length: int, fail: _Fail) -> None:
    """Padding declared and within bounds; every row reaches a rank as a real row."""
    owner: dict[int, tuple[int, tuple[int, ...]]] = {}
    for rank, chunk in enumerate(chunks):
        ids = _row_ids(chunk)
        if ids is None:
            raise fail("dispatch", f"rank {rank} received a chunk without the batch's columns (no {ROW_ID!r})")
        pad = chunk.meta_info.get(PADDING_ROWS_KEY, 0)
        if isinstance(pad, bool) or not isinstance(pad, int) or not 0 <= pad <= len(chunk):
            raise fail(
                "padding",
                f"rank {rank}'s chunk has {len(chunk)} rows but meta_info[{PADDING_ROWS_KEY!r}] = {pad!r}; "
                "it must count the chunk's trailing padding rows",
            )
        real = tuple(ids[: len(ids) - pad])
        outside = [i for i in ids if not 0 <= i < length]
        if outside:
            raise fail("dispatch", f"rank {rank} received rows {outside[:5]} that are not in the batch")
        for row in real:
            if row in owner and owner[row][1] != real:  # replicas share a whole chunk; others may not
                raise fail(
                    "padding",
                    f"input row {row} reaches both rank {owner[row][0]} and rank {rank} as a real row; rows "
                    f"repeated to even out chunks must be counted in meta_info[{PADDING_ROWS_KEY!r}]",
                )
            owner.setdefault(row, (rank, real))
    missing = sorted(set(range(length)) - set(owner))
    if missing:
        raise fail("dropped_rows", f"input rows {missing[:10]} reach no rank as a real row")


def _check_per_rank(result: Any, chunks: list[DataProto], fail: _Fail) -> None:
    if not isinstance(result, list) or len(result) != len(chunks):
        got = f"a list of {len(result)}" if isinstance(result, list) else type(result).__name__
        raise fail("round_trip", f"collect returned {got}; expected one output per rank ({len(chunks)})")
    for rank, (out, chunk) in enumerate(zip(result, chunks, strict=True)):
        if out is not chunk:
            source = next((r for r, c in enumerate(chunks) if c is out), None)
            where = f"rank {source}'s output" if source is not None else f"a {type(out).__name__}"
            raise fail("order", f"position {rank} of the collected list holds {where}, not rank {rank}'s output")


def _check_reduced(call: Any, reduce: Callable[[list[Any]], Any], outputs: Sequence[Any], fail: _Fail) -> None:
    """The caller gets ``reduce`` of the per-rank outputs (rank ``r`` returned ``outputs[r]``)."""
    outputs = list(outputs)
    if len(outputs) != call.world_size:
        raise DispatchValueError(f"outputs must hold one value per rank ({call.world_size}), got {len(outputs)}")
    expected = reduce(list(outputs))
    try:
        result = call.collect(list(outputs))
    except Exception as exc:
        raise fail("round_trip", f"collect raised {type(exc).__name__}: {exc}") from exc
    if not _same(result, expected):
        name = getattr(reduce, "__name__", repr(reduce))
        raise fail(
            "round_trip",
            f"collect gave {result!r} for the per-rank outputs {outputs!r}, whose {name}() is {expected!r}",
        )


def _same(result: Any, expected: Any) -> bool:
    """Equal values, tensors (dtype, shape, elements), arrays and DataProtos included."""
    if isinstance(result, DataProto) and isinstance(expected, DataProto):
        try:
            assert_dataproto_equal(result, expected)
        except AssertionError:
            return False
        return True
    if isinstance(result, torch.Tensor) and isinstance(expected, torch.Tensor):
        return result.dtype == expected.dtype and result.shape == expected.shape and torch.equal(result, expected)
    if isinstance(result, np.ndarray) or isinstance(expected, np.ndarray):
        return bool(np.array_equal(result, expected))
    try:
        return bool(result == expected)
    except Exception:  # noqa: BLE001 - an equality that cannot answer is a mismatch
        return False


def _check_rows(result: Any, sent: DataProto, fail: _Fail) -> None:
    if not isinstance(result, DataProto):
        raise fail("round_trip", f"collect returned {type(result).__name__}, expected a DataProto")
    if PADDING_ROWS_KEY in result.meta_info:
        raise fail("padding", f"the collected result still has meta_info[{PADDING_ROWS_KEY!r}]; collect must drop it")
    ids = _row_ids(result)
    if ids is None:
        raise fail("round_trip", f"the collected result lost the batch's columns (no {ROW_ID!r})")
    length = len(sent)
    missing = sorted(set(range(length)) - set(ids))
    if missing:
        raise fail("dropped_rows", f"input rows {missing[:10]} did not come back ({len(ids)} of {length} rows did)")
    if len(ids) > length:
        raise fail(
            "padding",
            f"{len(ids)} rows came back for {length}: padding rows were not removed "
            "(collect must trim them, e.g. with trim_padding and current_call().pad_size)",
        )
    if ids != list(range(length)):
        pos = next(p for p, i in enumerate(ids) if p != i)
        raise fail("order", f"result row {pos} is input row {ids[pos]}; rows must come back in input order")
    try:
        assert_dataproto_equal(result, sent, ignore_meta_keys=(PADDING_ROWS_KEY,))
    except AssertionError as exc:
        raise fail("round_trip", str(exc)) from None


def check_dispatch_mode(
    mode: Any,
    *,
    batches: st.SearchStrategy[DataProto] | None = None,
    world_sizes: st.SearchStrategy[int] | None = None,
    meshes: Callable[[int], st.SearchStrategy[Mesh]] | None = None,
    keyword: str | None = None,
    leading_args: Sequence[Any] = (),
    collects: Collects = "rows",
    outputs: st.SearchStrategy[Any] | None = None,
    max_examples: int | None = None,
) -> None:
    """Run :func:`assert_mode_properties` on many batches and world sizes (Hypothesis).

    Defaults: ``batches`` of 0..48 rows, padding on or off, every column kind;
    world sizes 1..16.  ``meshes(n)`` draws the nd layout for world size ``n``
    (e.g. ``lambda n: nd_meshes("dp", n)``); ``outputs`` draws what ranks of a
    reducing mode return; ``max_examples`` overrides the settings profile.
    The smallest failing example raises :class:`ModePropertyError`.
    """
    if batches is None:
        batches = strategies.dataprotos(max_len=48, with_tensors=None, auto_padding=None)
    if world_sizes is None:
        world_sizes = strategies.world_sizes()
    values = st.integers(-(2**31), 2**31) if outputs is None else outputs
    # No example database: one inner test serves every mode, so stored failures would cross modes.
    # The explain phase reruns a failure hundreds of times to annotate it; the error already says what broke.
    active = settings()  # the loaded profile's values

    @settings(
        active,
        deadline=None,
        report_multiple_bugs=False,
        database=None,
        phases=[phase for phase in active.phases if phase is not Phase.explain],
        max_examples=active.max_examples if max_examples is None else max_examples,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(data=batches, n=world_sizes, draw=st.data())
    def holds(data: DataProto, n: int, draw: st.DataObject) -> None:
        mesh = draw.draw(meshes(n), label="mesh") if meshes is not None else None
        per_rank = draw.draw(st.lists(values, min_size=n, max_size=n), label="outputs") if callable(collects) else None
        assert_mode_properties(
            mode, data, n, mesh=mesh, keyword=keyword, leading_args=leading_args, collects=collects, outputs=per_rank
        )

    holds()
