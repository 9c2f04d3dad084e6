"""What each side of a weight transfer declares: a source's dim-0 shards, a destination's slices.

RL code holds weights two ways: a trainer (FSDP) holds a dim-0 shard of
every parameter, a rollout engine (tensor parallel) wants a slice of each
along dim 0 (column-parallel) or dim 1 (row-parallel).  These records say
so; the plan (``_plan``) turns them into pieces and buckets.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Shard:
    """Rows ``offset .. offset + len(tensor)`` of a named tensor of shape ``full_shape`` (FSDP's dim-0 shard).

    A source rank's offer method returns ``{name: tensor}`` for a tensor it
    holds whole and ``{name: Shard(tensor, offset, full_shape)}`` for a
    shard; several source ranks may hold the same rows (replicas).
    """

    tensor: torch.Tensor
    offset: int
    full_shape: tuple[int, ...]

    def __post_init__(self) -> None:
        full = tuple(int(n) for n in self.full_shape)
        object.__setattr__(self, "full_shape", full)
        shape = tuple(self.tensor.shape)
        if not full or len(shape) != len(full) or shape[1:] != full[1:]:
            raise ValueError(f"Shard of shape {shape} cannot be dim-0 rows of a tensor of shape {full}")
        if self.offset < 0 or self.offset + shape[0] > full[0]:
            raise ValueError(f"Shard rows {self.offset}..{self.offset + shape[0]} lie outside 0..{full[0]}")


@dataclass(frozen=True)
class Slice:
    """What a destination rank asks for one name: ``start .. stop`` along ``dim`` (the rest whole)."""

    dim: int
    start: int
    stop: int

    def check(self, name: str, shape: tuple[int, ...]) -> None:
        """Refuse a slice outside ``shape`` (naming the tensor), so no plan is made from it."""
        if not 0 <= self.dim < len(shape) or not 0 <= self.start <= self.stop <= shape[self.dim]:
            raise ValueError(f"Slice({self.dim}, {self.start}, {self.stop}) does not fit {name!r} of shape {shape}")


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


def held_of(value: torch.Tensor | Shard, name: str) -> tuple[torch.Tensor, Held]:
    """The tensor behind an offered value and its :class:`Held` record."""
    if isinstance(value, Shard):
        rows = rows_of(tuple(value.tensor.shape))
        return value.tensor, Held(value.offset, rows, value.full_shape, value.tensor.dtype)
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"offered weight {name!r} is a {type(value).__name__}; offer a torch.Tensor or a Shard")
    shape = tuple(value.shape)
    return value, Held(0, rows_of(shape), shape, value.dtype)
