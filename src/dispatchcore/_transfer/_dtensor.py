"""What a source rank offers, as the transfer's own records: DTensors become the rows this rank holds.

FSDP2 keeps each parameter as a ``DTensor`` placed ``Shard(0)`` on a 1-D
mesh (HSDP: ``(Replicate(), Shard(0))`` on a 2-D one); ``state_dict()``
holds the same.  A transport cannot send a tensor subclass (gloo, numpy
and pickling of uneven shards all fail, some by killing the process), so
every offered value is read here, on its rank, before the plan: a DTensor
becomes its local tensor with the row offset and full shape it has
(:class:`RowShard`, or the tensor itself where this rank holds it whole),
and anything else that is not a plain tensor is refused by name before
anything moves.  Reading a DTensor's placement is local: no collective.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any, cast

import torch

from ._errors import WeightOfferError, WeightTypeError
from ._layout import RowShard

#: Tensor types sent as they are (a ``Parameter`` of a plain tensor is one).
_PLAIN = (torch.Tensor, torch.nn.Parameter)


def shard_rows(length: int, splits: Sequence[tuple[int, int]]) -> tuple[int, int]:
    """``(offset, rows)`` a rank holds of ``length`` rows split by ``(mesh size, coordinate)`` in mesh order.

    Each split is ``torch.chunk``'s (what ``Shard(0)`` and FSDP2 do): chunks
    of ``ceil(rows / size)``, the last ones shorter or empty; a second
    ``Shard(0)`` on another mesh dim splits the chunk the first one gave.
    """
    offset = 0
    for size, coordinate in splits:
        step = -(-length // size) if size else 0
        start = min(coordinate * step, length)
        length = min(start + step, length) - start
        offset += start
    return offset, length


def offered_record(value: Any, name: str) -> torch.Tensor | RowShard | None:
    """``value`` as a plain tensor or a :class:`RowShard`; ``None`` where this rank holds none of it.

    Raises :class:`WeightOfferError` / :class:`WeightTypeError` naming
    ``name`` for what cannot be sent as it is.
    """
    if isinstance(value, RowShard):
        _check_plain(value.tensor, name)
        return value
    if type(value) in _PLAIN:
        _check_plain(value, name)
        return cast(torch.Tensor, value)
    if not isinstance(value, torch.Tensor):
        raise WeightTypeError(
            f"offered weight {name!r} is a {type(value).__qualname__}: offer a torch.Tensor, a DTensor or a "
            "dispatchcore.RowShard(local_tensor, row_offset, full_shape)"
        )
    dtensors = sys.modules.get("torch.distributed.tensor")  # a DTensor exists only once this is imported
    if dtensors is not None and isinstance(value, dtensors.DTensor):
        return _from_dtensor(value, name)
    raise WeightTypeError(
        f"offered weight {name!r} is a {type(value).__qualname__} (a tensor subclass), which no transport can "
        "send as it is: offer a plain tensor (e.g. its unwrapped data), a DTensor or a RowShard"
    )


def _check_plain(tensor: Any, name: str) -> None:
    if type(tensor) not in _PLAIN:
        raise WeightTypeError(
            f"offered weight {name!r} holds a {type(tensor).__qualname__}: a RowShard's tensor must be a plain "
            "torch.Tensor (for a DTensor offer the DTensor itself)"
        )
    if tensor.is_meta or tensor.layout != torch.strided:
        where = "on the meta device (no data)" if tensor.is_meta else f"of layout {tensor.layout}"
        raise WeightOfferError(f"offered weight {name!r} is a tensor {where}; offer one whose values it holds")


def _from_dtensor(value: Any, name: str) -> torch.Tensor | RowShard | None:
    """This rank's rows of a DTensor placed ``Shard(0)`` and/or ``Replicate()`` on each mesh dim."""
    mesh, placements = value.device_mesh, tuple(value.placements)
    full = tuple(int(n) for n in value.shape)
    splits_on: list[int] = []
    for dim, placement in enumerate(placements):
        if placement.is_replicate():
            continue
        # _StridedShard (FSDP2 over tensor parallel) is a Shard(0) subclass whose rows interleave: refused.
        if type(placement).__name__ == "Shard" and placement.is_shard(0) and full:
            splits_on.append(dim)
            continue
        raise WeightOfferError(
            f"offered weight {name!r} is a DTensor placed {placements} on a mesh of shape "
            f"{tuple(mesh.shape)}: {placement!r} on mesh dim {dim} cannot be sent as it is (only Shard(0) and "
            "Replicate(), as FSDP2 and HSDP place parameters); offer value.redistribute(placements=[Shard(0) "
            "or Replicate()...]) or value.full_tensor()"
        )
    coordinate = mesh.get_coordinate()
    if coordinate is None:
        return None  # this rank is outside the DTensor's mesh: it holds none of it
    local: torch.Tensor = value.to_local().detach()
    _check_plain(local, name)
    offset, rows = shard_rows(full[0] if full else 1, [(mesh.size(d), coordinate[d]) for d in splits_on])
    expected = (rows, *full[1:]) if splits_on else full
    if tuple(local.shape) != expected:
        raise WeightOfferError(
            f"offered weight {name!r} is a DTensor placed {placements} of shape {full} whose local tensor on "
            f"mesh coordinate {tuple(coordinate)} has shape {tuple(local.shape)}, not the {expected} its placement "
            "gives (torch.chunk's split); offer a RowShard saying which rows it holds"
        )
    if not splits_on:
        return local
    return RowShard(local, offset, full)
