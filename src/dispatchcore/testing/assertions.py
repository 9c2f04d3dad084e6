"""Equality assertions for DataProtos, with messages that say what differs.

``DataProto`` has no ``==`` (tensors compare elementwise, NaN is unequal to
itself), so tests compare through :func:`assert_dataproto_equal`, and single
values (a meta_info entry, an item of an object column) through
:func:`values_equal`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

__all__ = ["assert_dataproto_equal", "values_equal"]


def assert_dataproto_equal(
    actual: Any,
    expected: Any,
    *,
    check_meta: bool = True,
    ignore_meta_keys: tuple[str, ...] = (),
) -> None:
    """Assert two DataProtos hold the same rows, dtypes, shapes and meta info.

    Tensors must match exactly (NaN equals NaN); object columns compare
    element by element; ``meta_info`` compares deeply unless
    ``check_meta=False``, skipping ``ignore_meta_keys``.
    """
    assert len(actual) == len(expected), f"lengths differ: {len(actual)} != {len(expected)}"
    a_batch, e_batch = actual.batch, expected.batch
    assert (a_batch is None) == (e_batch is None), f"one batch is None: actual {a_batch!r}, expected {e_batch!r}"
    if a_batch is not None:
        assert list(a_batch.keys()) == list(e_batch.keys()) or set(a_batch.keys()) == set(e_batch.keys()), (
            f"batch keys differ: {sorted(a_batch.keys())} != {sorted(e_batch.keys())}"
        )
        assert a_batch.batch_size == e_batch.batch_size, (
            f"batch sizes differ: {list(a_batch.batch_size)} != {list(e_batch.batch_size)}"
        )
        for key in e_batch.keys():
            _assert_tensor_equal(key, a_batch[key], e_batch[key])
    assert set(actual.non_tensor_batch) == set(expected.non_tensor_batch), (
        f"non_tensor_batch keys differ: {sorted(actual.non_tensor_batch)} != {sorted(expected.non_tensor_batch)}"
    )
    for key, e_col in expected.non_tensor_batch.items():
        a_col = actual.non_tensor_batch[key]
        assert isinstance(a_col, np.ndarray), f"non_tensor_batch[{key!r}] is not an ndarray"
        assert a_col.dtype == e_col.dtype and a_col.shape == e_col.shape, (
            f"non_tensor_batch[{key!r}]: {a_col.dtype}{a_col.shape} != {e_col.dtype}{e_col.shape}"
        )
        assert values_equal(a_col, e_col), f"non_tensor_batch[{key!r}] values differ"
    if check_meta:
        a_meta = {k: v for k, v in actual.meta_info.items() if k not in ignore_meta_keys}
        e_meta = {k: v for k, v in expected.meta_info.items() if k not in ignore_meta_keys}
        assert values_equal(a_meta, e_meta), f"meta_info differs: {a_meta!r} != {e_meta!r}"


def _assert_tensor_equal(key: str, a: torch.Tensor, e: torch.Tensor) -> None:
    assert isinstance(a, torch.Tensor), f"batch[{key!r}] is a {type(a).__name__}"
    assert a.dtype == e.dtype, f"batch[{key!r}] dtype {a.dtype} != {e.dtype}"
    assert a.shape == e.shape, f"batch[{key!r}] shape {tuple(a.shape)} != {tuple(e.shape)}"
    assert a.device == e.device, f"batch[{key!r}] device {a.device} != {e.device}"
    assert values_equal(a, e), f"batch[{key!r}] values differ"


def values_equal(a: Any, b: Any, _comparing: set[tuple[int, int]] | None = None) -> bool:
    """Deep equality that copes with tensors, arrays, NaN, nested containers and cycles.

    The rules ``DataProto.union`` and ``concat`` use for equal values: ``==``
    alone raises on arrays ("truth value is ambiguous") and calls NaN unequal
    to itself; meta_info and object columns hold both.  Tensors and arrays
    must match in dtype and shape too.  A pair of containers met again while
    being compared is taken as equal (an object array holding itself equals
    another of the same shape), so cycles end.
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
        result = a == b
        return bool(result)
    except Exception:
        return False
