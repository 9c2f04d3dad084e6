"""Checking and converting what users hand a DataProto: batches, columns, row indexes (a leaf module)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from dispatchcore._base._errors import DispatchIndexError, DispatchTypeError
from dispatchcore._data._tensor_batch import TensorBatch, is_tensordict

__all__ = ["as_batch", "as_column", "as_index", "not_a_dataproto"]


def as_batch(batch: Any) -> TensorBatch | None:
    """A TensorBatch (or None) from a TensorBatch, TensorDict or dict of tensors."""
    if batch is None or isinstance(batch, TensorBatch):
        return batch
    if is_tensordict(batch) or isinstance(batch, Mapping):
        return TensorBatch(batch)
    raise DispatchTypeError(f"DataProto.batch must be a TensorBatch, TensorDict or dict, got {type(batch).__name__}")


def as_column(key: str, value: Any) -> np.ndarray:
    """A non-tensor column as a numpy array; lists and tuples become object arrays."""
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, torch.Tensor):
        raise DispatchTypeError(f"non_tensor_batch[{key!r}] is a torch.Tensor; put tensors in the batch")
    if isinstance(value, list | tuple):
        return np.array(value, dtype=object)
    raise DispatchTypeError(f"non_tensor_batch[{key!r}] must be a numpy array or list, got {type(value).__name__}")


def as_index(idxs: Any, length: int | None = None) -> tuple[torch.Tensor, np.ndarray]:
    """An index list/array/tensor as a matching (torch, numpy) pair; with ``length``, checked against it."""
    if isinstance(idxs, list | tuple):
        arr = np.asarray(idxs) if len(idxs) else np.zeros(0, dtype=np.int64)
    elif isinstance(idxs, np.ndarray):
        arr = idxs
    elif isinstance(idxs, torch.Tensor):
        arr = idxs.detach().cpu().numpy()
    else:
        raise DispatchTypeError(f"cannot select rows with {type(idxs).__name__}; use a list, numpy array or tensor")
    if arr.ndim != 1:
        raise DispatchIndexError(f"row index must be 1-D, got shape {arr.shape}")
    if arr.dtype != bool and not np.issubdtype(arr.dtype, np.integer):
        raise DispatchTypeError(f"row index must hold ints or bools, got dtype {arr.dtype}")
    if arr.dtype != bool:
        arr = arr.astype(np.int64, copy=False)
    if length is not None and arr.dtype == bool and arr.shape[0] != length:
        raise DispatchIndexError(f"bool mask has {arr.shape[0]} entries for a DataProto of length {length}")
    if length is not None and arr.dtype != bool and arr.size and not (-length <= arr.min() and arr.max() < length):
        raise DispatchIndexError(f"row index out of range for a DataProto of length {length}")
    return torch.from_numpy(np.ascontiguousarray(arr)), arr


def not_a_dataproto(operation: str, value: Any) -> DispatchTypeError:
    """The error for a non-DataProto handed where one is needed, naming what it likely is and the fix."""
    kind = type(value).__name__
    if isinstance(value, (list, tuple)):
        fix = (
            f"a {kind} of {len(value)} (what a ONE_TO_ALL or ALL_TO_ALL call returns: one value per rank); pick "
            "one (e.g. result[0]) or register the method with Dispatch.DP_COMPUTE_PROTO to get one DataProto"
        )
    elif callable(getattr(value, "get", None)) and "Future" in kind:
        fix = f"a {kind} (what a blocking=False call returns); call .get() on it first"
    else:
        fix = f"a {kind}; build one with DataProto.from_dict(...)"
    return DispatchTypeError(f"{operation} takes a DataProto, got {fix}")
