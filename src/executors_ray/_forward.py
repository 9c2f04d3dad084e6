"""Passing one Ray group's ``DataProtoFuture`` into another group's call.

The driver never pulls the batch: it waits until the producing call's
results sit in the object store, asks one consuming actor (in its control
thread) for each result's row count and ``meta_info``, and hands every
consuming rank a :class:`Forwarded` part: the object references plus the row
ranges of its chunk.  The rank fetches those rows itself (zero-copy on the
same node), joins them into a fresh ``DataProto`` (private memory, so
isolation holds) and gets the ``meta_info`` the driver-side path would give.
Whenever something does not fit (a failed producer, another backend, a
result that is not a ``DataProto``), forwarding declines and the core
resolves the future on the driver as usual.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dispatchcore import PADDING_ROWS_KEY, DataProto, DataProtoConfig
from dispatchcore._dataproto import AUTO_PADDING_KEY
from dispatchcore._dataproto_ops import merge_meta_info

if TYPE_CHECKING:
    from ._executor import RayExecutor


@dataclass
class Forwarded:
    """One consuming rank's chunk: rows ``[lo, hi)`` of ``refs[i]`` for each piece."""

    refs: list[Any]
    pieces: list[tuple[int, int, int]]
    meta_info: dict[str, Any]


def describe_results(refs: list[Any], timeout: float) -> list[tuple[bool, int, dict[str, Any]] | None]:
    """Rank side: ``(ok, rows, meta_info)`` of each packed result (``None`` if not a DataProto)."""
    import ray

    from . import _payload
    from ._actor import OK_PACKED

    out: list[tuple[bool, int, dict[str, Any]] | None] = []
    for result in ray.get(list(refs), timeout=timeout):
        if type(result) is not tuple or result[0] != OK_PACKED:
            out.append(None)
            continue
        value = _payload.unpack(result[1], copy=False)
        out.append((True, len(value), dict(value.meta_info)) if isinstance(value, DataProto) else None)
    return out


def forward_future(executor: RayExecutor, future: Any, chunks: int) -> tuple[list[Any], int, int] | None:
    """Driver side of ``Executor.forward_future`` (see the module docstring)."""
    from ._handle import RayCallHandle

    handle = getattr(future, "handle", None)
    call = getattr(future, "call", None)
    if not isinstance(handle, RayCallHandle) or call is None or not call.results_are_copied:
        return None
    if handle.resolved or handle.source_ray is not executor.ray:
        return None  # already on the driver, or another Ray
    handle.wait_ready(call.timeout)
    ray = executor.ray
    actor = executor.actor(0)
    ref = actor.describe_results.options(concurrency_group="control").remote(
        list(handle.refs), executor.spec.death_timeout
    )
    ready, _ = ray.wait([ref], timeout=executor.spec.death_timeout)
    if not ready:
        return None
    try:
        described = ray.get(ready[0])
    except Exception:  # noqa: BLE001 - let the driver path report it
        return None
    positions = future.collect_positions
    picked = list(range(len(handle.refs))) if positions is None else list(positions)
    if any(described[p] is None for p in picked):
        return None
    try:
        meta = merge_meta_info([described[p][2] for p in picked])  # type: ignore[index]
    except ValueError:
        return None
    meta.pop(PADDING_ROWS_KEY, None)
    rows = [described[p][1] for p in picked]  # type: ignore[index]
    total = _trimmed_rows(sum(rows), future.pad_size, future.padded_len)
    if total <= 0:
        return None
    pad = (-total) % chunks
    allow = bool(meta.get(AUTO_PADDING_KEY, False)) or DataProtoConfig.auto_padding
    if pad and not allow:
        return None  # the driver path raises the BatchSizeError that says how to enable padding
    size = (total + pad) // chunks
    starts = [0]
    for n in rows:
        starts.append(starts[-1] + n)
    parts = []
    for j in range(chunks):
        lo, hi = j * size, (j + 1) * size
        part_meta = copy.deepcopy(meta)
        if allow:
            part_meta[PADDING_ROWS_KEY] = max(0, hi - max(lo, total))
        pieces = _pieces(lo, hi, total, starts, picked)
        parts.append(Forwarded(list(handle.refs), pieces, part_meta))
    return parts, pad, total + pad


def _trimmed_rows(total: int, pad_size: int, padded_len: int) -> int:
    """Rows the driver-side path keeps (mirrors ``trim_padding``)."""
    if pad_size <= 0:
        return total
    if padded_len and total % padded_len == 0:
        return total // padded_len * (padded_len - pad_size)
    return total - pad_size


def _pieces(lo: int, hi: int, total: int, starts: list[int], picked: list[int]) -> list[tuple[int, int, int]]:
    """Row ranges ``(result index, lo, hi)`` covering virtual rows ``[lo, hi)``, wrapping past ``total``."""
    out: list[tuple[int, int, int]] = []
    row = lo
    while row < hi:
        real = row % total
        span = min(hi - row, total - real)
        pos = 0
        while starts[pos + 1] <= real:
            pos += 1
        take = min(span, starts[pos + 1] - real)
        out.append((picked[pos], real - starts[pos], real - starts[pos] + take))
        row += take
    return out


def resolve_forwarded(part: Forwarded, isolate: bool, timeout: float = 300.0) -> DataProto:
    """Rank side: this rank's chunk as a fresh ``DataProto``.

    The rows are copied once by the join, so the result is private whatever
    ``isolate`` says.
    """
    import ray

    from . import _payload

    needed = sorted({i for i, _, _ in part.pieces})
    fetched = dict(zip(needed, ray.get([part.refs[i] for i in needed], timeout=timeout), strict=True))
    results = {i: _payload.unpack(fetched[i][1], copy=False) for i in needed}
    pieces = []
    for i, lo, hi in part.pieces:
        piece = results[i][lo:hi]
        piece.meta_info = {}
        pieces.append(piece)
    out = DataProto.concat(pieces)  # one copy: private, writable memory
    out.meta_info = copy.deepcopy(part.meta_info)
    return out
