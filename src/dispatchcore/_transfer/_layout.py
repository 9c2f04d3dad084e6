"""What each side of a weight transfer declares: a source's dim-0 shards, a destination's slices.

RL code holds weights two ways: a trainer (FSDP) holds a dim-0 shard of
every parameter, a rollout engine (tensor parallel) wants a slice of each
along dim 0 (column-parallel) or dim 1 (row-parallel).  These records say
so; the plan (``_plan``) turns them into pieces and buckets.  A trainer's
DTensors become :class:`RowShard` records on its rank (``_dtensor``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .._base import DispatchValueError
from ._errors import WeightOfferError


@dataclass(frozen=True)
class RowShard:
    """Rows ``offset .. offset + len(tensor)`` of a named tensor of shape ``full_shape`` (FSDP's dim-0 shard).

    A source rank's offer method returns ``{name: tensor}`` for a tensor it
    holds whole and ``{name: RowShard(tensor, offset, full_shape)}`` for a
    shard (or the DTensor itself); several source ranks may hold the same
    rows (replicas).  Named apart from ``torch.distributed.tensor.Shard``
    (a placement, not a record); ``dispatchcore.Shard`` is the old name.
    """

    tensor: torch.Tensor
    offset: int
    full_shape: tuple[int, ...]

    def __post_init__(self) -> None:
        full = tuple(int(n) for n in self.full_shape)
        object.__setattr__(self, "full_shape", full)
        shape = tuple(self.tensor.shape)
        if not full or len(shape) != len(full) or shape[1:] != full[1:]:
            raise WeightOfferError(f"RowShard of shape {shape} cannot be dim-0 rows of a tensor of shape {full}")
        if self.offset < 0 or self.offset + shape[0] > full[0]:
            raise WeightOfferError(f"RowShard rows {self.offset}..{self.offset + shape[0]} lie outside 0..{full[0]}")


#: The old name of :class:`RowShard` (kept working; it clashes with torch's ``Shard`` placement).
Shard = RowShard


@dataclass(frozen=True)
class Slice:
    """What a destination rank asks for one name: ``start .. stop`` along ``dim`` (the rest whole)."""

    dim: int
    start: int
    stop: int

    def check(self, name: str, shape: tuple[int, ...]) -> None:
        """Refuse a slice outside ``shape`` (naming the tensor), so no plan is made from it."""
        if not 0 <= self.dim < len(shape) or not 0 <= self.start <= self.stop <= shape[self.dim]:
            raise DispatchValueError(
                f"Slice({self.dim}, {self.start}, {self.stop}) does not fit {name!r} of shape {shape}"
            )


@dataclass(frozen=True)
class Held:
    """What one source rank holds of one name, as the plan sees it (no tensor: it stays on the rank)."""

    offset: int
    rows: int
    full_shape: tuple[int, ...]
    dtype: torch.dtype


def rows_of(shape: tuple[int, ...]) -> int:
    """Dim-0 length, a 0-dim tensor counting as one row."""
    return shape[0] if shape else 1


def row_elements(shape: tuple[int, ...], cut: Slice | None) -> int:
    """Elements in one dim-0 row of ``shape`` restricted by ``cut`` (along a dim other than 0)."""
    dims = list(shape[1:])
    if cut is not None:
        dims[cut.dim - 1] = cut.stop - cut.start
    n = 1
    for d in dims:
        n *= d
    return n


def rows_view(tensor: torch.Tensor, offset: int, rows: tuple[int, int], cut: Slice | None) -> torch.Tensor:
    """Full-tensor rows ``rows`` (columns ``cut``) of ``tensor``, which holds rows from ``offset``: a view."""
    if tensor.dim() == 0:
        return tensor  # its one row
    t = tensor.narrow(0, rows[0] - offset, rows[1] - rows[0])
    if cut is not None:
        t = t.narrow(cut.dim, cut.start, cut.stop - cut.start)
    return t


def held_of(value: torch.Tensor | RowShard) -> tuple[torch.Tensor, Held]:
    """The tensor behind an offered value (a plain tensor or a record, see ``_dtensor``) and its :class:`Held`."""
    if isinstance(value, RowShard):
        rows = rows_of(tuple(value.tensor.shape))
        return value.tensor, Held(value.offset, rows, value.full_shape, value.tensor.dtype)
    shape = tuple(value.shape)
    return value, Held(0, rows_of(shape), shape, value.dtype)
