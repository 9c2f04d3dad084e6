"""Equality assertions for DataProtos (which have no ``==``), with messages that say what differs."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from .. import values_equal

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
