"""Row reshaping: repeating rows and folding/unfolding the batch dim (results built with ``type(data)``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

import numpy as np
import torch

from dispatchcore._base._errors import BatchSizeError, DispatchValueError
from dispatchcore._data._rows_like import RowsLike, check_positive
from dispatchcore._data._tensor_batch import TensorBatch

__all__ = [
    "fold_batch_dim",
    "repeat_rows",
    "repeat_rows_per_sample",
    "unfold_batch_dim",
    "unfold_column_chunks",
]

D = TypeVar("D", bound=RowsLike)


def repeat_rows(data: D, repeat_times: int = 2, interleave: bool = True) -> D:
    """Each row ``repeat_times`` times: ``aabb`` (interleave) or ``abab``."""
    if repeat_times < 0:
        raise DispatchValueError(f"repeat_times must be >= 0, got {repeat_times}")
    rows = np.arange(len(data))
    return data._take(np.repeat(rows, repeat_times) if interleave else np.tile(rows, repeat_times))


def repeat_rows_per_sample(data: D, repeat_times: Sequence[int] | np.ndarray | torch.Tensor) -> D:
    """Row i repeated ``repeat_times[i]`` times (interleaved)."""
    if isinstance(repeat_times, torch.Tensor):
        counts = repeat_times.detach().cpu().numpy()
    else:
        counts = np.asarray(list(repeat_times) if isinstance(repeat_times, tuple) else repeat_times)
    if counts.ndim != 1 or counts.shape[0] != len(data):
        raise BatchSizeError(f"repeat_times has shape {counts.shape}; expected ({len(data)},)")
    if counts.size and counts.min() < 0:
        raise DispatchValueError("repeat_times must be >= 0")
    return data._take(np.repeat(np.arange(len(data)), counts.astype(np.int64)))


def unfold_column_chunks(data: D, n_split: int, split_keys: list[str] | None = None) -> D:
    """Split dim 1 of ``split_keys`` into ``n_split`` rows each; other columns repeat."""
    keys = set(split_keys or ())

    def unfold(value: Any) -> Any:
        if value.shape[1] % n_split:
            raise BatchSizeError(f"dim 1 of size {value.shape[1]} does not divide by n_split={n_split}")
        return value.reshape(value.shape[0] * n_split, value.shape[1] // n_split, *value.shape[2:])

    batch = None
    if data.batch is not None:
        tensors = {k: unfold(v) if k in keys else v.repeat_interleave(n_split, dim=0) for k, v in data.batch.items()}
        batch = TensorBatch(tensors, batch_size=[len(data) * n_split])
    non_tensor = {
        k: unfold(v) if k in keys else np.repeat(v, n_split, axis=0) for k, v in data.non_tensor_batch.items()
    }
    return type(data)(batch=batch, non_tensor_batch=non_tensor, meta_info=dict(data.meta_info))


def fold_batch_dim(data: D, new_batch_size: int) -> D:
    """``[bsz, ...] -> [new_batch_size, bsz // new_batch_size, ...]`` for every column."""
    new_batch_size = check_positive("new_batch_size", new_batch_size)
    length = len(data)
    if length % new_batch_size:
        raise BatchSizeError(f"cannot fold a batch of {length} rows into {new_batch_size} rows")
    batch = None
    if data.batch is not None:
        tensors = {k: v.reshape(new_batch_size, -1, *v.shape[1:]) for k, v in data.batch.items()}
        batch = TensorBatch(tensors, batch_size=[new_batch_size])
    non_tensor = {k: np.reshape(v, (new_batch_size, -1, *v.shape[1:])) for k, v in data.non_tensor_batch.items()}
    return type(data)(batch=batch, non_tensor_batch=non_tensor, meta_info=dict(data.meta_info))


def unfold_batch_dim(data: D, batch_dims: int = 2) -> D:
    """Merge the first ``batch_dims`` dims of every column into one batch dim."""
    batch_dims = check_positive("batch_dims", batch_dims)
    non_tensor: dict[str, np.ndarray] = {}
    for key, value in data.non_tensor_batch.items():
        rows = int(np.prod(value.shape[:batch_dims]))
        non_tensor[key] = np.reshape(value, (rows, *value.shape[batch_dims:]))
    batch = None
    if data.batch is not None:
        tensors = {k: v.reshape(-1, *v.shape[batch_dims:]) for k, v in data.batch.items()}
        sizes = [t.shape[0] for t in tensors.values()] + [a.shape[0] for a in non_tensor.values()]
        batch = TensorBatch(tensors, batch_size=[sizes[0] if sizes else len(data)])
    return type(data)(batch=batch, non_tensor_batch=non_tensor, meta_info=dict(data.meta_info))
