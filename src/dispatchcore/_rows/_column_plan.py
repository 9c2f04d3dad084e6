"""Where each row of a lazy column comes from: row arithmetic without the rows.

Slicing, gathering, padding and concatenation only rewrite a plan; a read moves only the rows it names.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .._wire import NUMPY_ALLOC_BYTES, cat_rows, numpy_tensor

#: Rows of a source: a step-1 slice or an int array.
Index = slice | np.ndarray


def compact(index: np.ndarray) -> Index:
    """An int array as a slice when it is one consecutive increasing run."""
    if len(index) and int(index[-1]) - int(index[0]) == len(index) - 1 and bool(np.all(np.diff(index) == 1)):
        return slice(int(index[0]), int(index[-1]) + 1)
    return index


def index_key(index: Index) -> tuple[Any, ...]:
    """A hashable form of ``index`` (to group identical requests)."""
    if isinstance(index, slice):
        return ("slice", index.start, index.stop)
    return ("array", index.tobytes())


@dataclass(frozen=True)
class Segment:
    """Rows ``index`` of ``source`` (a :class:`~dispatchcore._rows._remote.RemoteRows` or a local array)."""

    source: Any
    index: Index

    def __len__(self) -> int:
        index = self.index
        return index.stop - index.start if isinstance(index, slice) else len(index)

    def narrow(self, sub: Index) -> Segment:
        """Rows ``sub`` (relative) of this segment's rows."""
        index = self.index
        if isinstance(index, slice):
            if isinstance(sub, slice):
                return Segment(self.source, slice(index.start + sub.start, index.start + sub.stop))
            return Segment(self.source, compact(sub + index.start))
        return Segment(self.source, compact(index[sub.start : sub.stop] if isinstance(sub, slice) else index[sub]))


def local_rows(segment: Segment) -> Any:
    """The rows of a segment whose source is a driver-side tensor or array."""
    source, index = segment.source, segment.index
    if isinstance(index, slice) or not isinstance(source, torch.Tensor):
        return source[index]
    return source[torch.from_numpy(index)]


@dataclass(frozen=True)
class ColumnPlan:
    """``concat(segment rows)[order]`` (``order`` ``None``: no reordering)."""

    segments: tuple[Segment, ...]
    order: np.ndarray | None = None

    @classmethod
    def local(cls, column: Any) -> ColumnPlan:
        return cls((Segment(column, slice(0, len(column))),))

    def __len__(self) -> int:
        if self.order is not None:
            return len(self.order)
        return sum(len(s) for s in self.segments)

    def take(self, rows: Index) -> ColumnPlan:
        """The plan of rows ``rows`` (a step-1 slice or an int array) of this column."""
        if isinstance(rows, slice) and self.order is None:
            return ColumnPlan(tuple(_slice_segments(self.segments, rows.start, rows.stop)))
        positions = np.arange(len(self)) if self.order is None else self.order
        picked = positions[rows] if isinstance(rows, slice) else positions[np.asarray(rows, dtype=np.int64)]
        return _regroup(self.segments, picked)

    @staticmethod
    def concat(plans: Sequence[ColumnPlan]) -> ColumnPlan:
        segments: list[Segment] = []
        orders: list[np.ndarray] = []
        reordered = any(p.order is not None for p in plans)
        offset = 0
        for plan in plans:
            count = sum(len(s) for s in plan.segments)
            if reordered:
                orders.append((plan.order if plan.order is not None else np.arange(count)) + offset)
            segments.extend(plan.segments)
            offset += count
        return ColumnPlan(tuple(segments), np.concatenate(orders) if reordered else None)

    def assemble(self, values: Callable[[Segment], Any], owned: Callable[[Segment], bool] = lambda s: False) -> Any:
        """The column in private memory: each segment's rows joined, then reordered (a lone ``owned`` one as is)."""
        parts = [values(s) for s in self.segments]
        if len(parts) == 1 and self.order is None and owned(self.segments[0]):
            return parts[0]
        if parts and isinstance(parts[0], torch.Tensor):
            joined: Any = cat_rows(parts) if len(parts) > 1 else _copy(parts[0])
            return joined if self.order is None else joined[torch.from_numpy(self.order)]
        joined = np.concatenate(parts) if len(parts) > 1 else parts[0].copy()
        return joined if self.order is None else joined[self.order]


def _copy(tensor: torch.Tensor) -> torch.Tensor:
    """A private copy; large CPU tensors go into numpy-allocated memory (fewer page faults)."""
    if tensor.device.type != "cpu" or tensor.nbytes < NUMPY_ALLOC_BYTES or tensor.requires_grad:
        return tensor.clone()
    return numpy_tensor(tuple(tensor.shape), tensor.dtype).copy_(tensor)


def _slice_segments(segments: Sequence[Segment], start: int, stop: int) -> list[Segment]:
    out: list[Segment] = []
    offset = 0
    for segment in segments:
        length = len(segment)
        lo, hi = max(start - offset, 0), min(stop - offset, length)
        if lo < hi:
            out.append(segment if (lo, hi) == (0, length) else segment.narrow(slice(lo, hi)))
        offset += length
        if offset >= stop:
            break
    return out


def _regroup(segments: Sequence[Segment], picked: np.ndarray) -> ColumnPlan:
    """Segments holding only the ``picked`` positions of ``concat(segments)``, plus the order to put them back."""
    order = np.empty(len(picked), dtype=np.int64)
    out: list[Segment] = []
    offset = 0
    placed = 0
    for segment in segments:
        length = len(segment)
        inside = (picked >= offset) & (picked < offset + length)
        count = int(inside.sum())
        if count:
            out.append(segment.narrow(compact(picked[inside] - offset)))
            order[inside] = np.arange(placed, placed + count)
            placed += count
        offset += length
    plain = bool(np.array_equal(order, np.arange(len(order))))
    return ColumnPlan(tuple(out), None if plain else order)
