"""Equality, unions and merging of meta info and column dicts, as plain-dict rules (no DataProto needed)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from dispatchcore._base._errors import BatchSizeError, DispatchValueError
from dispatchcore._data._rows_like import PADDING_ROWS_KEY
from dispatchcore._data._tensor_batch import TensorBatch

__all__ = [
    "merge_meta_info",
    "union_numpy_dict",
    "union_tensor_dict",
    "union_two_dict",
    "values_equal",
]


def values_equal(a: Any, b: Any, _comparing: set[tuple[int, int]] | None = None) -> bool:
    """Deep equality for tensors, arrays, NaN, nested containers and cycles (where ``==`` raises or says no)."""
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
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    nested = (
        (isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.dtype == object)
        or (isinstance(a, Mapping) and isinstance(b, Mapping))
        or (isinstance(a, list | tuple) and isinstance(b, list | tuple))
    )
    if not nested:
        return _flat_equal(a, b)
    comparing = set() if _comparing is None else _comparing
    pair = (id(a), id(b))
    if pair in comparing:
        return True
    comparing.add(pair)
    try:
        if isinstance(a, np.ndarray):
            same_shape = a.shape == b.shape
            return same_shape and all(values_equal(x, y, comparing) for x, y in zip(a.flat, b.flat, strict=True))
        if isinstance(a, Mapping):
            return a.keys() == b.keys() and all(values_equal(a[k], b[k], comparing) for k in a)
        same_len = type(a) is type(b) and len(a) == len(b)
        return same_len and all(values_equal(x, y, comparing) for x, y in zip(a, b, strict=True))
    finally:
        comparing.discard(pair)


def _flat_equal(a: Any, b: Any) -> bool:
    """Equality of values that hold no other values to recurse into."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)):
            return False
        if a.dtype != b.dtype or a.shape != b.shape:
            return False
        return bool(np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"))
    try:
        return bool(a == b)
    except Exception:
        return False


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
                # verl's wording first, so logs and tests written against verl still match
                raise DispatchValueError(
                    f"`{key}` in tensor_dict1 and tensor_dict2 are not the same object. "
                    f"(union: batch key {key!r} has different values in the two DataProtos)"
                )
        else:
            tensor_dict1[key] = value
    return tensor_dict1


def union_numpy_dict(tensor_dict1: dict[str, np.ndarray], tensor_dict2: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Add ``tensor_dict2``'s arrays to ``tensor_dict1``; shared keys must be equal."""
    for key, value in tensor_dict2.items():
        if key in tensor_dict1 and not values_equal(tensor_dict1[key], value):
            raise DispatchValueError(
                f"`{key}` in tensor_dict1 and tensor_dict2 are not the same object. "
                f"(union: non_tensor_batch key {key!r} has different values in the two DataProtos)"
            )
        tensor_dict1[key] = value
    return tensor_dict1


def union_two_dict(dict1: dict[str, Any], dict2: Mapping[str, Any]) -> dict[str, Any]:
    """Add ``dict2``'s items to ``dict1``; shared keys must hold equal values."""
    for key, value in dict2.items():
        if key in dict1 and not values_equal(dict1[key], value):
            raise DispatchValueError(f"union: meta_info key {key!r} differs: {dict1[key]!r} vs {value!r}")
        dict1[key] = value
    return dict1


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
    """verl's concat rule: ``metrics`` gathered into lists, other keys must agree (:data:`PADDING_ROWS_KEY` dropped)."""
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
                raise DispatchValueError(
                    f"Conflicting values for meta_info key {key!r}: {_short(merged[key])} "
                    f"(earlier items) vs {_short(value)} (item {pos})"
                )
    if metrics:
        merged["metrics"] = _dict_of_lists(metrics)
    return merged


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
