"""Private copies equal to a pickle round trip (docs/design.md, "Invariants"), made without pickling.

Inside one process a copy stands in for the transport; the common types are copied directly (far cheaper).
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from .._data import DataProto, TensorBatch
from .._wire import dumps, round_trip

#: Immutable values: a round trip gives an equal object, so the same one will do.
ATOMS = frozenset({type(None), bool, int, float, complex, str, bytes, range, type(Ellipsis)})
_IMMUTABLE_ITEMS = frozenset({type(None), bool, int, float, complex, str, bytes})
#: Passed by reference, as pickle does for importable callables.
_BY_REFERENCE = (types.FunctionType, types.BuiltinFunctionType, types.ModuleType, type)


def isolated_copy(obj: Any) -> Any:
    """A copy sharing no mutable memory with ``obj`` (callables stay shared)."""
    kind = type(obj)
    if kind in ATOMS:
        return obj
    copier = _copiers.get(kind)
    if copier is not None:
        return copier(obj)
    if isinstance(obj, _BY_REFERENCE):
        return obj
    return round_trip(obj)


def check_copyable(obj: Any) -> None:
    """Raise what :func:`isolated_copy` of ``obj`` would raise, pickling only what the copy would pickle."""
    kind = type(obj)
    if kind in ATOMS or kind is torch.Tensor or kind is TensorBatch:
        return
    if kind is np.ndarray:
        if obj.dtype == object and not set(map(type, obj.ravel())) <= _IMMUTABLE_ITEMS:
            for item in obj.ravel():
                check_copyable(item)
        return
    if kind is DataProto:
        for array in obj.non_tensor_batch.values():
            check_copyable(array)
        check_copyable(obj.meta_info)
        return
    if kind is dict:
        for key, value in obj.items():
            check_copyable(key)
            check_copyable(value)
        return
    if kind in (list, tuple, set, frozenset):
        for value in obj:
            check_copyable(value)
        return
    if kind in _copiers or isinstance(obj, _BY_REFERENCE):
        return
    dumps(obj, share_callables=True)


def _copy_tensor(t: torch.Tensor) -> torch.Tensor:
    if not t.requires_grad:
        return t.clone()  # no history to drop: one torch call (each releases and retakes the GIL)
    out = t.detach().clone()
    if t.is_leaf:
        out.requires_grad_(True)
    return out


def _copy_array(a: np.ndarray) -> np.ndarray:
    if a.dtype != object or set(map(type, a.ravel())) <= _IMMUTABLE_ITEMS:
        return a.copy()
    out = np.empty_like(a)
    for index, item in np.ndenumerate(a):
        out[index] = isolated_copy(item)
    return out


def _copy_batch(batch: TensorBatch) -> TensorBatch:
    out = TensorBatch.__new__(TensorBatch)
    out._batch_size = batch._batch_size
    out._tensors = {k: _copy_tensor(v) for k, v in batch._tensors.items()}
    return out


def _copy_meta(meta: dict[str, Any]) -> dict[str, Any]:
    """A chunk's meta_info: usually empty or a few immutable entries, copied without recursing."""
    for key, value in meta.items():
        if type(key) not in ATOMS or type(value) not in ATOMS:
            return {isolated_copy(k): isolated_copy(v) for k, v in meta.items()}
    return dict(meta)


def _copy_dataproto(data: DataProto) -> DataProto:
    out = DataProto.__new__(type(data))
    out.__dict__.update(data.__dict__)
    batch = data._batch
    out._batch = None if batch is None else _copy_batch(batch)
    arrays = data.non_tensor_batch
    out.non_tensor_batch = {k: _copy_array(v) for k, v in arrays.items()} if arrays else {}
    meta = data.meta_info
    out.meta_info = _copy_meta(meta) if type(meta) is dict else isolated_copy(meta)
    return out


_copiers: dict[type, Callable[[Any], Any]] = {
    torch.Tensor: _copy_tensor,
    np.ndarray: _copy_array,
    dict: lambda d: {isolated_copy(k): isolated_copy(v) for k, v in d.items()},
    list: lambda seq: [isolated_copy(v) for v in seq],
    tuple: lambda seq: tuple(isolated_copy(v) for v in seq),
    set: lambda s: {isolated_copy(v) for v in s},
    frozenset: lambda s: frozenset(isolated_copy(v) for v in s),
    TensorBatch: _copy_batch,
    DataProto: _copy_dataproto,
}
