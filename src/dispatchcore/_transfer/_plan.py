"""The transfer plan: which rows of which tensor go from which source rank to which destination ranks.

A pure function of what the sources hold (:class:`Held`), what each
destination wants (whole, or a :class:`Slice`) and the bucket size.  Each
tensor's rows are covered by source ranks (replicas share the work); every
region several destinations want alike is one piece sent once to all of
them; pieces go into buckets of one source rank and one set of destinations
(so every destination of a bucket uses all of it), split along dim 0 where a
bucket boundary falls inside a tensor.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from .._base import DispatchValueError
from ._errors import WeightOfferError
from ._layout import Held, Slice, row_elements, rows_of

#: Bytes of one bucket unless the caller says otherwise.
DEFAULT_BUCKET_BYTES = 64 << 20


@dataclass(frozen=True)
class TensorSpec:
    """One tensor as destinations see it: its source name, full shape and the dtype it arrives in."""

    source_name: str
    full_shape: tuple[int, ...]
    dtype: torch.dtype


@dataclass(frozen=True)
class Wanted:
    """What one destination rank assembles for one name: full rows ``rows`` restricted by ``cut``."""

    rows: tuple[int, int]
    cut: Slice | None
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class Piece:
    """Full-tensor rows ``rows`` of ``name`` (columns ``cut``, if any), as one tensor of ``shape``."""

    source_name: str
    name: str
    rows: tuple[int, int]
    cut: Slice | None
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def nbytes(self) -> int:
        return self.dtype.itemsize * math.prod(self.shape)


@dataclass(frozen=True)
class Bucket:
    """Pieces one source rank sends together to the same destination ranks (positions in each group)."""

    index: int
    source: int
    destinations: tuple[int, ...]
    pieces: tuple[Piece, ...]

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.pieces)


@dataclass(frozen=True)
class TransferPlan:
    """Every bucket in the order they are sent, and what each destination rank assembles."""

    buckets: tuple[Bucket, ...]
    wanted: tuple[Mapping[str, Wanted], ...]

    @property
    def nbytes(self) -> int:
        """Bytes that leave source ranks (each piece once, however many destinations read it)."""
        return sum(b.nbytes for b in self.buckets)


def wanted_region(name: str, spec: TensorSpec, want: Slice | None) -> Wanted:
    """The rows, column cut and shape one destination assembles for ``name``."""
    shape = spec.full_shape
    if want is None:
        return Wanted((0, rows_of(shape)), None, shape, spec.dtype)
    want.check(name, shape)
    sliced = tuple(want.stop - want.start if d == want.dim else n for d, n in enumerate(shape))
    if want.dim == 0:
        return Wanted((want.start, want.stop), None, sliced, spec.dtype)
    return Wanted((0, rows_of(shape)), want, sliced, spec.dtype)


def cover(name: str, spec: TensorSpec, held: Sequence[Mapping[str, Held]], turn: int = 0) -> list[tuple[int, int, int]]:
    """``(start, stop, source)`` segments covering every row of the tensor; replicas take turns.

    Turns go by segment and by ``turn`` (the tensor's position), so replicas
    of whole tensors (``Replicate``) share the sending too.
    """
    holders = []
    first: tuple[int, torch.dtype] | None = None  # the first holder's rank and dtype: the others must agree
    for source, offered in enumerate(held):
        h = offered.get(spec.source_name)
        if h is None:
            continue
        if h.full_shape != spec.full_shape:
            raise WeightOfferError(
                f"source ranks disagree on the shape of {spec.source_name!r}: {h.full_shape} and {spec.full_shape}"
            )
        if first is None:
            first = (source, h.dtype)
        elif h.dtype != first[1]:
            raise WeightOfferError(
                f"source ranks disagree on the dtype of {spec.source_name!r}: source rank {first[0]} offers "
                f"{first[1]}, source rank {source} {h.dtype}; replicas and shards of one weight must share a "
                "dtype (cast them alike before offering; WeightSync(dtype=...) casts on the way)"
            )
        holders.append((h.offset, h.offset + h.rows, source))
    total = rows_of(spec.full_shape)
    cuts = sorted({0, total, *(a for a, _, _ in holders), *(b for _, b, _ in holders)})
    segments: list[tuple[int, int, int]] = []
    for k, (a, b) in enumerate(itertools.pairwise(cuts)):
        if a >= b or b > total:
            continue
        candidates = [s for lo, hi, s in holders if lo <= a and b <= hi]
        if not candidates:
            raise WeightOfferError(
                f"rows {a}..{b} of {spec.source_name!r} (for {name!r}) are held by no source rank; every row of a "
                "weight must be offered by some source rank (a RowShard or DTensor shard each)"
            )
        source = candidates[(k + turn) % len(candidates)]
        if segments and segments[-1][1] == a and segments[-1][2] == source:
            segments[-1] = (segments[-1][0], b, source)
        else:
            segments.append((a, b, source))
    return segments


def plan_transfer(
    held: Sequence[Mapping[str, Held]],
    tensors: Mapping[str, TensorSpec],
    wants: Sequence[Mapping[str, Slice | None]],
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
) -> TransferPlan:
    """The plan for sending ``tensors`` (by destination name) from ``held`` to ``len(wants)`` destinations.

    ``wants[d]`` maps a name to the :class:`Slice` destination ``d`` asks
    for; a name it does not list it receives whole.
    """
    if bucket_bytes <= 0:
        raise DispatchValueError(f"bucket_bytes must be positive, not {bucket_bytes}")
    wanted: list[dict[str, Wanted]] = [{} for _ in wants]
    grouped: dict[tuple[int, tuple[int, ...]], list[Piece]] = {}
    for turn, (name, spec) in enumerate(tensors.items()):
        regions: dict[tuple[tuple[int, int], Slice | None], list[int]] = {}
        for d, want in enumerate(wants):
            region = wanted[d][name] = wanted_region(name, spec, want.get(name))
            regions.setdefault((region.rows, region.cut), []).append(d)
        if not regions:
            continue
        segments = cover(name, spec, held, turn)
        for (rows, cut), dests in regions.items():
            per_row = row_elements(spec.full_shape, cut)
            if per_row == 0:
                continue  # nothing to send: the destination makes the empty tensor itself
            for a, b, source in segments:
                lo, hi = max(a, rows[0]), min(b, rows[1])
                if lo < hi:
                    piece = _piece(spec, name, (lo, hi), cut)
                    grouped.setdefault((source, tuple(dests)), []).append(piece)
    buckets = [bucket for key, pieces in grouped.items() for bucket in _fill(key, pieces, bucket_bytes)]
    order = {name: i for i, name in enumerate(tensors)}
    buckets.sort(key=lambda b: (order[b[2][0].name], b[2][0].rows[0], b[0], b[1]))
    return TransferPlan(
        tuple(Bucket(i, source, dests, tuple(pieces)) for i, (source, dests, pieces) in enumerate(buckets)),
        tuple(wanted),
    )


def _piece(spec: TensorSpec, name: str, rows: tuple[int, int], cut: Slice | None) -> Piece:
    shape = list(spec.full_shape)
    if shape:
        shape[0] = rows[1] - rows[0]
    if cut is not None:
        shape[cut.dim] = cut.stop - cut.start
    return Piece(spec.source_name, name, rows, cut, tuple(shape), spec.dtype)


def _split(piece: Piece, rows: int) -> tuple[Piece, Piece]:
    """``piece``'s first ``rows`` rows and the rest."""
    a, b = piece.rows
    head = Piece(piece.source_name, piece.name, (a, a + rows), piece.cut, (rows, *piece.shape[1:]), piece.dtype)
    tail = Piece(piece.source_name, piece.name, (a + rows, b), piece.cut, (b - a - rows, *piece.shape[1:]), piece.dtype)
    return head, tail


def _fill(
    key: tuple[int, tuple[int, ...]], pieces: list[Piece], bucket_bytes: int
) -> list[tuple[int, tuple[int, ...], list[Piece]]]:
    """Buckets of at most ``bucket_bytes`` (one row larger than that goes alone), pieces split by rows."""
    out: list[tuple[int, tuple[int, ...], list[Piece]]] = []
    current: list[Piece] = []
    used = 0
    queue = list(reversed(pieces))
    while queue:
        piece = queue.pop()
        room = bucket_bytes - used
        if piece.nbytes <= room:
            current.append(piece)
            used += piece.nbytes
            continue
        rows = piece.rows[1] - piece.rows[0]
        row_bytes = piece.nbytes // rows
        fit = room // row_bytes
        if fit == 0 and current:
            out.append((*key, current))
            current, used = [], 0
            queue.append(piece)
            continue
        head, tail = _split(piece, max(fit, 1)) if piece.shape else (piece, None)
        current.append(head)
        out.append((*key, current))
        current, used = [], 0
        if tail is not None and tail.rows[0] < tail.rows[1]:
            queue.append(tail)
    if current:
        out.append((*key, current))
    return out
