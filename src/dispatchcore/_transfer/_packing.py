"""Small pieces travel packed: one tensor per bucket for them, not one message per piece.

Between processes each tensor a link moves is a message of its own (a gloo
send and receive, an array in a Ray object); a small model's bucket holds
dozens of pieces of a few KiB, where that per-message cost is the whole
cost.  The pieces under :data:`SMALL` bytes go as one ``uint8`` tensor,
each at an 8-byte aligned offset (so it can be viewed in its dtype): copied
in on the source, out of the link's memory on the destination (or kept
there, as a whole piece the link gave would be), cheap for small pieces.
Within a process (views handed over) nothing is packed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ._plan import Bucket

#: Pieces under this many bytes travel packed.
SMALL = 256 << 10
_ALIGN = 8


def packed(bucket: Bucket, link: Any) -> list[int]:
    """Positions of the pieces that travel packed (none within a process, through the driver, or alone)."""
    if link is None or link.same_process:
        return []
    small = [i for i, piece in enumerate(bucket.pieces) if piece.nbytes < SMALL]
    return small if len(small) > 1 else []


def _offsets(bucket: Bucket, small: Sequence[int]) -> tuple[list[int], int]:
    offsets, used = [], 0
    for i in small:
        offsets.append(used)
        used += -(-bucket.pieces[i].nbytes // _ALIGN) * _ALIGN
    return offsets, used


def pack(bucket: Bucket, small: Sequence[int], tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """What the link publishes: the small pieces in one tensor, then the others as they are."""
    if not small:
        return tensors
    offsets, size = _offsets(bucket, small)
    flat = torch.empty(size, dtype=torch.uint8)
    for i, offset in zip(small, offsets, strict=True):
        nbytes = bucket.pieces[i].nbytes
        flat[offset : offset + nbytes].copy_(tensors[i].contiguous().reshape(-1).view(torch.uint8))
    kept = set(small)
    return [flat, *(t for i, t in enumerate(tensors) if i not in kept)]


def places(small: Sequence[int], into: list[torch.Tensor | None]) -> list[torch.Tensor | None]:
    """Where the link receives: the packed pieces in its own memory (copied out after), each other in its place."""
    if not small:
        return into
    kept = set(small)
    return [None, *(t for i, t in enumerate(into) if i not in kept)]


def unpack(
    bucket: Bucket, small: Sequence[int], got: list[torch.Tensor], into: list[torch.Tensor | None]
) -> list[torch.Tensor]:
    """Every piece as the link's ``got`` would give it unpacked: copied into its place, or a view of the pack."""
    if not small:
        return got
    offsets = dict(zip(small, _offsets(bucket, small)[0], strict=True))
    flat, others = got[0].reshape(-1).view(torch.uint8), iter(got[1:])
    out = []
    for i, piece in enumerate(bucket.pieces):
        if i not in offsets:
            out.append(next(others))
            continue
        x = flat[offsets[i] : offsets[i] + piece.nbytes].view(piece.dtype).reshape(piece.shape)
        place = into[i]
        if place is not None:
            place.copy_(x)
        out.append(x if place is None else place)
    return out
