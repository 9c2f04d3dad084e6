"""Checksums of transferred regions, computed on the ranks (``WeightSync.verify``): only digests travel.

A source digests each region it holds of the plan's pieces, from what it
offered, in the dtype the piece travels in; a destination digests the same
region of what its read method says it holds now (after ``load_weights``),
cast to that dtype.  Equal digests mean equal bytes (as far as a
checksum tells: it guards against transport and apply mistakes, not
against an adversary).

The digest is cheap, because ``verify=True`` runs it over every byte on
both sides of every transfer: BLAKE2b cost 3-4 times the transfer itself.
Regions under :data:`SMALL` bytes take CRC-32 (``zlib``, a few µs there);
larger ones are read as 64-bit words in blocks of 512 bytes, each block
summed (one read pass in numpy, faster than a memcpy of the bytes), and
the block sums folded with their positions, so a changed word, a lost or
shifted block, or a transposed tensor changes it.  A reordering confined
to one 512-byte block of a large region goes unseen.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy
import torch

from .._base import DispatchAttributeError
from ._dtensor import offered_record
from ._layout import Held, held_of, rows_view
from ._plan import Piece

#: One region to digest: its index in the driver's list, the piece, the full shape of its name.
Region = tuple[int, Piece, tuple[int, ...]]


#: Regions under this many bytes are digested with CRC-32; larger ones by block sums.
SMALL = 64 << 10
#: 64-bit words per block of the block sums (512 bytes).
_BLOCK = 64


def digest(tensor: torch.Tensor) -> str:
    """A digest of ``tensor``'s bytes (any dtype, any device): a short string without spaces."""
    t = tensor.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    if not t.is_contiguous():
        t = t.contiguous()
    flat = t.reshape(-1).view(torch.uint8)  # a few calls only: small regions are many
    if flat.numel() < SMALL:
        return f"c{zlib.crc32(flat.numpy().data):08x}.{flat.numel()}"
    words = flat.numel() // 8
    head = flat[: words * 8]
    if head.data_ptr() % 8:  # a view at an odd offset: words need aligned memory
        head = head.clone()
    blocks = words // _BLOCK
    grid = head.numpy().view(numpy.int64)[: blocks * _BLOCK].reshape(blocks, _BLOCK)
    # numpy, not torch: one thread, the GIL let go, where torch's threads fight the rank's own (2-3x slower here)
    sums = grid.sum(axis=1)  # wraps modulo 2**64, as wanted
    weighted = int(sums @ numpy.arange(1, blocks + 1, dtype=numpy.int64))
    rest = zlib.crc32(flat[blocks * _BLOCK * 8 :].numpy().data)
    return f"s{int(sums.sum()) & (2**64 - 1):016x}{weighted & (2**64 - 1):016x}{rest:08x}.{flat.numel()}"


def source_sums(offered: Mapping[str, tuple[torch.Tensor, Held]], regions: Sequence[Region]) -> dict[int, str]:
    """Digests of the regions this source rank holds, from the tensors it offered for this transfer."""
    out = {}
    for index, piece, _ in regions:
        tensor, held = offered[piece.source_name]
        out[index] = digest(_as(rows_view(tensor, held.offset, piece.rows, piece.cut), piece.dtype))
    return out


def destination_sums(
    worker: Any, read: str, regions: Sequence[Region], wanted_rows: Mapping[str, int]
) -> dict[int, str]:
    """Digests of the regions as this destination holds them now; a reason in words where it holds none.

    ``read`` names the worker's method returning ``{name: tensor}`` of what
    it holds (whole, its slice, a RowShard or a DTensor); ``wanted_rows``
    gives the first full-tensor row of each name's wanted region.
    """
    fn = getattr(worker, read, None)
    if fn is None:
        raise DispatchAttributeError(
            f"{type(worker).__name__} has no method {read!r} returning the weights it holds, which verify() "
            "reads back; define it (returning {name: tensor}) or pass WeightSync(..., read=...)"
        )
    held = dict(fn())
    out: dict[int, str] = {}
    for index, piece, full in regions:
        value = held.get(piece.name)
        record = None if value is None else offered_record(value, piece.name)
        if record is None:
            out[index] = f"no {piece.name!r} held"
            continue
        out[index] = _region_sum(*held_of(record), piece, full, wanted_rows[piece.name])
    return out


def _region_sum(tensor: torch.Tensor, held: Held, piece: Piece, full: tuple[int, ...], first_row: int) -> str:
    """The piece's region of what a destination holds: the full tensor, its rows, or its wanted region."""
    shape = tuple(tensor.shape)
    if held.full_shape == full:  # whole, or rows of the whole (a RowShard / DTensor)
        if held.offset > piece.rows[0] or piece.rows[1] > held.offset + held.rows:
            return f"holds rows {held.offset}..{held.offset + held.rows}, not {piece.rows[0]}..{piece.rows[1]}"
        region = rows_view(tensor, held.offset, piece.rows, piece.cut)
    elif piece.cut is not None and shape[piece.cut.dim] == piece.shape[piece.cut.dim] and shape[0] == full[0]:
        region = rows_view(tensor, 0, piece.rows, None)  # its column slice, every row
    elif shape[1:] == piece.shape[1:] and shape[0] >= piece.rows[1] - first_row:
        region = rows_view(tensor, first_row, piece.rows, None)  # its row slice
    else:
        return f"holds shape {shape}, which is neither {full} nor the region it wanted"
    return digest(_as(region, piece.dtype))


def _as(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return tensor if tensor.dtype == dtype else tensor.to(dtype)
