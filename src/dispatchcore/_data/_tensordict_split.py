"""TensorDict arguments and results of the DP dispatch modes, split and joined like DataProto.

No auto-padding (the length must divide); jagged tensors go through their ``values`` and ``offsets``.
"""

from __future__ import annotations

import sys
from typing import Any

import torch

from .._base import BatchSizeError, DispatchError


def is_tensordict(value: Any) -> bool:
    """Whether ``value`` is a ``tensordict.TensorDictBase`` (without importing tensordict)."""
    td = sys.modules.get("tensordict")
    base = getattr(td, "TensorDictBase", None)
    return base is not None and isinstance(value, base)


# Jagged tensors are typed ``Any``: ``offsets()``, ``lengths()``, ``_ragged_idx`` are NestedTensor's, not Tensor's.
def _is_jagged(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.is_nested and value.layout == torch.jagged


def _jagged_rows(nt: Any, start: int, stop: int) -> torch.Tensor:
    """Rows ``[start, stop)`` of a jagged tensor, with their own compact values (not a view of the whole)."""
    ragged = nt._ragged_idx  # the public constructor takes it back as jagged_dim
    if nt.lengths() is not None:  # holes between rows: rebuild from the rows themselves
        return _jagged_from_rows(list(nt.unbind(0)[start:stop]), ragged)
    offsets = nt.offsets()
    first, last = int(offsets[start]), int(offsets[stop])
    values = nt.values().narrow(ragged - 1, first, last - first).clone()
    return torch.nested.nested_tensor_from_jagged(values, offsets[start : stop + 1] - first, jagged_dim=ragged)


def _jagged_from_rows(rows: list[torch.Tensor], ragged: int) -> torch.Tensor:
    lengths = torch.tensor([r.shape[ragged - 1] for r in rows], dtype=torch.int64)
    offsets = torch.zeros(len(rows) + 1, dtype=torch.int64)
    torch.cumsum(lengths, 0, out=offsets[1:])
    values = torch.cat(rows, dim=ragged - 1)
    return torch.nested.nested_tensor_from_jagged(values, offsets.to(values.device), jagged_dim=ragged)


def _jagged_concat(parts: list[Any]) -> torch.Tensor:
    ragged = {p._ragged_idx for p in parts}
    if len(ragged) != 1:
        raise DispatchError(f"cannot join jagged tensors ragged in different dimensions ({sorted(ragged)})")
    (dim,) = ragged
    if any(p.lengths() is not None for p in parts):
        return _jagged_from_rows([row for p in parts for row in p.unbind(0)], dim)
    values, offsets, base = [], [torch.zeros(1, dtype=torch.int64)], 0
    for part in parts:
        o = part.offsets().to(torch.int64).cpu()
        first, last = int(o[0]), int(o[-1])
        values.append(part.values().narrow(dim - 1, first, last - first))
        offsets.append(o[1:] - first + base)
        base += last - first
    joined = torch.cat(values, dim=dim - 1)
    return torch.nested.nested_tensor_from_jagged(joined, torch.cat(offsets).to(joined.device), jagged_dim=dim)


def slice_rows(data: Any, start: int, stop: int) -> Any:
    """Rows ``[start, stop)`` of a TensorDict, jagged entries included."""
    jagged = [key for key, value in data.items() if _is_jagged(value)]
    if not jagged:
        return data[start:stop]
    part = data.exclude(*jagged)[start:stop]
    for key in jagged:
        part.set(key, _jagged_rows(data.get(key), start, stop))
    return part


def chunk_tensordict(data: Any, chunks: int) -> list[Any]:
    """``chunks`` TensorDicts of equal row counts, in order; the length must divide."""
    if len(data.batch_size) == 0:
        raise BatchSizeError(
            "a TensorDict passed to a DP dispatch mode needs a batch dimension (batch_size=[rows]), got batch_size=[]"
        )
    rows = int(data.batch_size[0])
    if chunks < 1 or rows % chunks:
        raise BatchSizeError(
            f"a TensorDict of {rows} rows cannot be split into {chunks} equal chunks; TensorDicts are not "
            f"padded: give it a multiple of {chunks} rows, or pass a DataProto made with auto_padding=True"
        )
    size = rows // chunks
    return [slice_rows(data, i * size, (i + 1) * size) for i in range(chunks)]


def concat_tensordicts(parts: list[Any]) -> Any:
    """One TensorDict of ``parts`` stacked by rows, in order (verl's collect)."""
    if not parts:
        raise DispatchError("no TensorDict results to concatenate")
    if all(len(p.batch_size) == 0 for p in parts):
        return parts[0]  # meta-only results: verl keeps the first
    jagged = sorted(key for key, value in parts[0].items() if _is_jagged(value))
    for position, part in enumerate(parts):
        found = sorted(key for key, value in part.items() if _is_jagged(value))
        if found != jagged:
            raise DispatchError(
                f"TensorDict results disagree on their jagged entries: position 0 has {jagged}, "
                f"position {position} has {found}"
            )
    if not jagged:
        return torch.cat(list(parts), dim=0)
    out: Any = torch.cat([p.exclude(*jagged) for p in parts], dim=0)
    for key in jagged:
        out.set(key, _jagged_concat([p.get(key) for p in parts]))
    return out
