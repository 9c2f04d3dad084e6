"""Hypothesis strategies for DataProtos.

``dataprotos()`` draws batches the way real RL data looks: int64 token ids,
float32 / bfloat16 values, bool masks with assorted trailing shapes (empty
dims included), an object column of strings, and meta info.  Tensor values
come from a drawn seed, so large batches stay cheap to generate; the shape,
dtypes, strings and meta info shrink normally.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from hypothesis import strategies as st

from dispatchcore._dataproto import DataProto
from dispatchcore.testing.assertions import assert_dataproto_equal

__all__ = [
    "DEFAULT_DTYPES",
    "assert_dataproto_equal",
    "dataprotos",
    "meta_infos",
    "trailing_shapes",
]

DEFAULT_DTYPES: tuple[torch.dtype, ...] = (torch.int64, torch.float32, torch.bool, torch.bfloat16)

_KEYS = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=8)


def trailing_shapes(max_dims: int = 2, max_side: int = 3) -> st.SearchStrategy[tuple[int, ...]]:
    """Per-row shapes: ``()``, ``(3,)``, ``(2, 0)`` ..."""
    return st.lists(st.integers(0, max_side), max_size=max_dims).map(tuple)


def meta_infos() -> st.SearchStrategy[dict[str, Any]]:
    """Small JSON-like meta dicts (ints, floats without NaN, strings, lists)."""
    leaf = st.one_of(
        st.integers(-(2**31), 2**31),
        st.floats(allow_nan=False, allow_infinity=False, width=32),
        st.text(max_size=6),
        st.booleans(),
    )
    value = st.one_of(leaf, st.lists(leaf, max_size=3))
    return st.dictionaries(_KEYS.map(lambda k: "m_" + k), value, max_size=3)


def _make_tensor(rng: np.random.Generator, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    if dtype == torch.bool:
        return torch.from_numpy(rng.random(shape) < 0.5)
    if dtype.is_floating_point:
        values = rng.standard_normal(shape).astype(np.float32)
        return torch.from_numpy(values).to(dtype)
    info = torch.iinfo(dtype)
    low, high = max(info.min, -(2**40)), min(info.max, 2**40)
    return torch.from_numpy(rng.integers(low, high, size=shape, dtype=np.int64)).to(dtype)


@st.composite
def dataprotos(
    draw: st.DrawFn,
    min_len: int = 0,
    max_len: int = 32,
    *,
    dtypes: tuple[torch.dtype, ...] = DEFAULT_DTYPES,
    max_tensor_keys: int = 3,
    with_tensors: bool | None = True,
    with_non_tensors: bool | None = None,
    with_meta: bool = True,
    auto_padding: bool | None = False,
) -> DataProto:
    """A DataProto of ``min_len..max_len`` rows.

    ``with_tensors`` / ``with_non_tensors``: True always, False never, None
    drawn.  With neither, an object column is added so the length is
    carried.  ``auto_padding=None`` draws the padding flag.
    """
    length = draw(st.integers(min_len, max_len))
    has_tensors = draw(st.booleans()) if with_tensors is None else with_tensors
    has_objects = draw(st.booleans()) if with_non_tensors is None else with_non_tensors
    if not has_tensors and not has_objects:
        has_objects = True
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)

    tensors: dict[str, torch.Tensor] = {}
    if has_tensors:
        n_keys = draw(st.integers(1, max(1, max_tensor_keys)))
        for i in range(n_keys):
            dtype = draw(st.sampled_from(dtypes))
            shape = draw(trailing_shapes())
            tensors[f"t{i}_{str(dtype).removeprefix('torch.')}"] = _make_tensor(rng, dtype, (length, *shape))

    non_tensors: dict[str, np.ndarray] = {}
    if has_objects:
        words = draw(st.lists(st.text(max_size=4), min_size=length, max_size=length))
        column = np.empty(length, dtype=object)
        column[:] = words
        non_tensors["text"] = column
        if draw(st.booleans()):
            non_tensors["uid"] = rng.integers(0, 1000, size=length).astype(np.int32)

    meta = draw(meta_infos()) if with_meta else {}
    padding = draw(st.booleans()) if auto_padding is None else auto_padding
    return DataProto.from_dict(tensors, non_tensors, meta, auto_padding=padding)
