"""Free functions over DataProto: padding, chunking, folding, unions, equality.

They live apart from the class so that ``_dataproto.py`` stays readable.
Every function here builds its results with ``type(data)`` and never
mutates its input unless verl's function of the same name does so by
contract (the ``union_*`` helpers update their first argument in place).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import torch

from dispatchcore._errors import BatchSizeError
from dispatchcore._tensor_batch import TensorBatch

if TYPE_CHECKING:
    from dispatchcore._dataproto import DataProto, DataProtoItem

__all__ = [
    "PADDING_ROWS_KEY",
    "chunk_with_padding",
    "collate_fn",
    "fold_batch_dim",
    "merge_meta_info",
    "pad_dataproto_to_divisor",
    "unfold_batch_dim",
    "union_numpy_dict",
    "union_python_dict",
    "union_tensor_dict",
    "union_two_dict",
    "unpad_dataproto",
    "values_equal",
]

D = TypeVar("D", bound="DataProto")

#: ``meta_info`` key of a chunk: how many of its trailing rows are padding.
PADDING_ROWS_KEY = "padding_rows"


# -- equality -------------------------------------------------------------------


def values_equal(a: Any, b: Any) -> bool:
    """Deep equality that copes with tensors, arrays, NaN and nested containers.

    ``==`` alone raises on arrays ("truth value is ambiguous") and calls
    NaN unequal to itself; meta_info and object columns hold both.
    """
    if a is b:
        return True
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return False
        if a.shape != b.shape or a.dtype != b.dtype:
            return False
        if a.is_floating_point() or a.is_complex():
            return bool(torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(), b.nan_to_num()))
        return bool(torch.equal(a, b))
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)):
            return False
        if a.dtype != b.dtype or a.shape != b.shape:
            return False
        if a.dtype != object:
            kind_nan = a.dtype.kind in "fc"
            return bool(np.array_equal(a, b, equal_nan=kind_nan))
        return all(values_equal(x, y) for x, y in zip(a.flat, b.flat, strict=True))
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(values_equal(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return type(a) is type(b) and len(a) == len(b) and all(map(values_equal, a, b))
    try:
        result = a == b
        return bool(result)
    except Exception:
        return False


# -- unions (verl's helpers; update their first argument) -------------------------


def union_tensor_dict(tensor_dict1: TensorBatch, tensor_dict2: TensorBatch) -> TensorBatch:
    """Add ``tensor_dict2``'s tensors to ``tensor_dict1``; shared keys must be equal."""
    if tensor_dict1.batch_size != tensor_dict2.batch_size:
        raise BatchSizeError(
            f"cannot union batches of different sizes: {list(tensor_dict1.batch_size)} "
            f"and {list(tensor_dict2.batch_size)}"
        )
    for key, value in tensor_dict2.items():
        if key in tensor_dict1:
            if not values_equal(tensor_dict1[key], value):
                raise ValueError(f"union: batch key {key!r} differs between the two DataProtos")
        else:
            tensor_dict1[key] = value
    return tensor_dict1


def union_numpy_dict(tensor_dict1: dict[str, np.ndarray], tensor_dict2: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Add ``tensor_dict2``'s arrays to ``tensor_dict1``; shared keys must be equal."""
    for key, value in tensor_dict2.items():
        if key in tensor_dict1 and not values_equal(tensor_dict1[key], value):
            raise ValueError(f"union: non_tensor_batch key {key!r} differs between the two DataProtos")
        tensor_dict1[key] = value
    return tensor_dict1


def union_two_dict(dict1: dict[str, Any], dict2: Mapping[str, Any]) -> dict[str, Any]:
    """Add ``dict2``'s items to ``dict1``; shared keys must hold equal values."""
    for key, value in dict2.items():
        if key in dict1 and not values_equal(dict1[key], value):
            raise ValueError(f"union: meta_info key {key!r} differs: {dict1[key]!r} vs {value!r}")
        dict1[key] = value
    return dict1


union_python_dict = union_two_dict


# -- meta_info merging for concat ---------------------------------------------------


def _dict_of_lists(dicts: Sequence[Any]) -> Any:
    """``[{a: 1}, {a: 2}] -> {a: [1, 2]}``; anything not all-dicts stays a list."""
    if not all(isinstance(d, Mapping) for d in dicts):
        return list(dicts)
    out: dict[Any, list[Any]] = {}
    for d in dicts:
        for key, value in d.items():
            out.setdefault(key, []).append(value)
    return out


def merge_meta_info(metas: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """verl's concat rule: ``metrics`` gathered into lists, other keys must agree.

    The per-chunk :data:`PADDING_ROWS_KEY` is dropped: it differs by design.
    """
    merged: dict[str, Any] = {}
    metrics: list[Any] = []
    for pos, meta in enumerate(metas):
        for key, value in meta.items():
            if key == PADDING_ROWS_KEY:
                continue
            if key == "metrics":
                if isinstance(value, list):
                    metrics.extend(value)
                elif value is not None:
                    metrics.append(value)
            elif key not in merged:
                merged[key] = value
            elif not values_equal(merged[key], value):
                raise ValueError(
                    f"Conflicting values for meta_info key {key!r}: {_short(merged[key])} "
                    f"(earlier items) vs {_short(value)} (item {pos})"
                )
    if metrics:
        merged["metrics"] = _dict_of_lists(metrics)
    return merged


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# -- padding and chunking -------------------------------------------------------------


def _check_positive(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value <= 0:
        raise ValueError(f"{name} must be positive, got {value}")
    return int(value)


def pad_dataproto_to_divisor(data: D, size_divisor: int) -> tuple[D, int]:
    """Pad ``data`` so its length divides by ``size_divisor``; returns ``(padded, pad_size)``.

    Padding rows repeat rows from the start (row 0, 1, ... wrapping), as verl
    does.  ``data`` is never modified; without padding the result is a view.
    """
    divisor = _check_positive("size_divisor", size_divisor)
    length = len(data)
    pad_size = (-length) % divisor
    if pad_size == 0:
        return data[:], 0
    return data._take(np.arange(length + pad_size) % length), pad_size


def unpad_dataproto(data: D, pad_size: int) -> D:
    """Drop the last ``pad_size`` rows (``data[:-pad_size]``); a view."""
    if pad_size < 0:
        raise ValueError(f"pad_size must be >= 0, got {pad_size}")
    if pad_size > len(data):
        raise BatchSizeError(f"cannot remove {pad_size} padding rows from a DataProto of length {len(data)}")
    return data[: len(data) - pad_size] if pad_size else data


def _padding_rows_in(start: int, stop: int, real_end: int) -> int:
    """How many of virtual rows ``[start, stop)`` lie at or past ``real_end``."""
    return max(0, min(stop - start, stop - real_end))


def _existing_padding(data: DataProto) -> int | None:
    value = data.meta_info.get(PADDING_ROWS_KEY)
    if value is None:
        return None
    if not isinstance(value, int | np.integer) or not 0 <= value <= len(data):
        raise ValueError(f"meta_info[{PADDING_ROWS_KEY!r}]={value!r} is not a row count within 0..{len(data)}")
    return int(value)


def chunk_with_padding(data: D, n: int, allow_padding: bool | None = None) -> tuple[list[D], int]:
    """Split ``data`` into ``n`` equal chunks, padding when allowed; returns ``(chunks, pad_size)``.

    ``allow_padding=None`` means ``data.is_padding_enabled()``.  Without
    padding, a length that ``n`` does not divide raises :class:`BatchSizeError`.
    Chunks without padding rows are views of ``data``; only chunks holding
    padding rows are gathered copies.  When padding is allowed (or ``data``
    already says it holds padding), every chunk's ``meta_info`` carries
    :data:`PADDING_ROWS_KEY`: how many of its trailing rows are padding.
    """
    n = _check_positive("chunks", n)
    if allow_padding is None:
        allow_padding = data.is_padding_enabled()
    length = len(data)
    pad_size = (-length) % n
    if pad_size and not allow_padding:
        raise BatchSizeError(
            f"cannot split a DataProto of length {length} into {n} equal chunks "
            f"({length} % {n} = {length % n}); enable padding with "
            "DataProto.from_dict(..., auto_padding=True) (or DataProtoConfig.auto_padding = True), "
            "or pad it first with pad_dataproto_to_divisor(data, n)"
        )
    existing = _existing_padding(data)
    mark = allow_padding or existing is not None
    real_end = length - (existing or 0)
    size = (length + pad_size) // n
    chunks: list[D] = []
    for i in range(n):
        start, stop = i * size, (i + 1) * size
        if stop <= length:
            piece = data[start:stop]
        else:
            piece = data._take(np.arange(start, stop) % length)
        if mark:
            piece.meta_info[PADDING_ROWS_KEY] = _padding_rows_in(start, stop, real_end)
        chunks.append(piece)
    return chunks, pad_size


def split_views(data: D, split_size: int) -> list[D]:
    """``data`` in consecutive views of ``split_size`` rows (the last may be short)."""
    split_size = _check_positive("split_size", split_size)
    length = len(data)
    existing = _existing_padding(data)
    out: list[D] = []
    for start in range(0, length, split_size):
        stop = min(start + split_size, length)
        piece = data[start:stop]
        if existing is not None:
            piece.meta_info[PADDING_ROWS_KEY] = _padding_rows_in(start, stop, length - existing)
        out.append(piece)
    return out


# -- folding ----------------------------------------------------------------------------


def fold_batch_dim(data: D, new_batch_size: int) -> D:
    """``[bsz, ...] -> [new_batch_size, bsz // new_batch_size, ...]`` for every column."""
    new_batch_size = _check_positive("new_batch_size", new_batch_size)
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
    batch_dims = _check_positive("batch_dims", batch_dims)
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


# -- collation (verl's collate_fn for DataLoader over a DataProto) ----------------------------


def collate_fn(x: list[DataProtoItem]) -> DataProto:
    """Stack row items back into a DataProto (non-tensors become object arrays, as in verl)."""
    from dispatchcore._dataproto import DataProto

    batch = None
    rows = [item.batch for item in x]
    if rows and all(r is not None for r in rows):
        batch = TensorBatch.stack(rows).contiguous()  # type: ignore[arg-type]
    keys: list[str] = list(x[0].non_tensor_batch) if x else []
    non_tensor = {key: _stack_column([item.non_tensor_batch[key] for item in x]) for key in keys}
    return DataProto(batch=batch, non_tensor_batch=non_tensor)


def _stack_column(values: list[Any]) -> np.ndarray:
    """Rows of one non-tensor column back into an array, keeping numeric dtypes."""
    if values and all(isinstance(v, np.ndarray) for v in values):
        return np.stack(values)
    if values and all(isinstance(v, np.generic) and not isinstance(v, np.object_) for v in values):
        return np.array(values)
    column = np.empty(len(values), dtype=object)
    for i, value in enumerate(values):
        column[i] = value
    return column
