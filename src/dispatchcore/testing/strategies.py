"""Hypothesis strategies for DataProtos, their columns and world sizes.

``dataprotos()`` draws batches the way real RL data looks, and the corners
real data hits (length 0, empty dims, ragged object columns); tensor values
come from a drawn seed, so large batches stay cheap to generate.  Usage:
docs/testing.md.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from hypothesis import strategies as st

from dispatchcore import DataProto, DispatchValueError
from dispatchcore.testing.assertions import assert_dataproto_equal

__all__ = [
    "ALL_DTYPES",
    "DEFAULT_DTYPES",
    "OBJECT_KINDS",
    "assert_dataproto_equal",
    "dataprotos",
    "meta_infos",
    "nd_meshes",
    "non_tensor_columns",
    "tensor_dtypes",
    "trailing_shapes",
    "world_sizes",
]

#: The dtypes ``dataprotos()`` draws by default (what RL batches hold).
DEFAULT_DTYPES: tuple[torch.dtype, ...] = (torch.int64, torch.float32, torch.bool, torch.bfloat16)

#: Every dtype DataProto carries through chunk, concat, pickle and the wire.
ALL_DTYPES: tuple[torch.dtype, ...] = (
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.complex64,
)

#: Kinds of non-tensor column :func:`non_tensor_columns` draws.
OBJECT_KINDS: tuple[str, ...] = ("text", "ragged_lists", "ragged_arrays", "mixed_objects", "numeric")

_KEYS = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=8)


def world_sizes(min_size: int = 1, max_size: int = 16) -> st.SearchStrategy[int]:
    """Numbers of ranks to dispatch over (shrinks towards ``min_size``)."""
    if min_size < 1 or max_size < min_size:
        raise DispatchValueError(f"world_sizes needs 1 <= min_size <= max_size, got {min_size}..{max_size}")
    return st.integers(min_size, max_size)


@st.composite
def nd_meshes(draw: st.DrawFn, mesh_name: str, world_size: int) -> dict[str, list[tuple[int, bool]]]:
    """Any nd layout of ``world_size`` ranks on ``mesh_name``: ``{mesh_name: [(dp_rank, is_collect), ...]}``.

    The dp size divides the world; a dp rank's replicas sit anywhere and one of them collects.
    """
    dp = draw(st.sampled_from([d for d in range(1, world_size + 1) if world_size % d == 0]))
    replicas = world_size // dp
    slots = draw(st.permutations(list(range(world_size))))
    return {mesh_name: [(slots[r] // replicas, slots[r] % replicas == 0) for r in range(world_size)]}


# Strategies are built once and reused: building one inside every draw costs
# more than drawing from it (Hypothesis validates and inspects each new one).


def tensor_dtypes(dtypes: Sequence[torch.dtype] = ALL_DTYPES) -> st.SearchStrategy[torch.dtype]:
    """One of ``dtypes`` (default: every dtype in :data:`ALL_DTYPES`)."""
    return _sampled(tuple(dtypes))


_sampled = functools.cache(st.sampled_from)


@functools.cache
def trailing_shapes(max_dims: int = 2, max_side: int = 3) -> st.SearchStrategy[tuple[int, ...]]:
    """Per-row shapes: ``()``, ``(3,)``, ``(2, 0)`` ..."""
    return st.lists(st.integers(0, max_side), max_size=max_dims).map(tuple)


@functools.cache
def meta_infos() -> st.SearchStrategy[dict[str, Any]]:
    """Small meta dicts: ints, floats without NaN, strings, bools, None, lists and nested dicts."""
    leaf = st.one_of(
        st.integers(-(2**31), 2**31),
        st.floats(allow_nan=False, allow_infinity=False, width=32),
        st.text(max_size=6),
        st.booleans(),
        st.none(),
    )
    value = st.recursive(
        leaf,
        lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(_KEYS, inner, max_size=2)),
        max_leaves=6,
    )
    return st.dictionaries(_KEYS.map(lambda k: "m_" + k), value, max_size=3)


def _ragged_array(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 100, size=int(rng.integers(0, 5)), dtype=np.int64)


_SEEDS = st.integers(0, 2**32 - 1)
_OBJECT_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "text": st.text(max_size=4),
    "ragged_lists": st.lists(st.integers(-5, 5), max_size=4),
    "ragged_arrays": _SEEDS.map(_ragged_array),
    "mixed_objects": st.one_of(
        st.none(), st.integers(), st.text(max_size=3), st.dictionaries(_KEYS, st.integers(), max_size=2)
    ),
}
_NUMERIC_DTYPES = st.sampled_from((np.int32, np.float64))
_NUMERIC_TRAILING = st.lists(st.integers(0, 3), max_size=1)


@functools.cache
def _column_values(kind: str, length: int) -> st.SearchStrategy[list[Any]]:
    return st.lists(_OBJECT_VALUES[kind], min_size=length, max_size=length)


def _check_kinds(kinds: Sequence[str]) -> tuple[str, ...]:
    unknown = set(kinds) - set(OBJECT_KINDS)
    if unknown or not kinds:
        raise DispatchValueError(f"unknown non-tensor column kinds {sorted(unknown)}; choose from {OBJECT_KINDS}")
    return tuple(kinds)


def _draw_column(draw: st.DrawFn, length: int, kinds: tuple[str, ...]) -> np.ndarray:
    kind = draw(_sampled(kinds))
    if kind == "numeric":
        dtype = draw(_NUMERIC_DTYPES)
        shape = (length, *draw(_NUMERIC_TRAILING))
        rng = np.random.default_rng(draw(_SEEDS))
        return (rng.standard_normal(shape) * 100).astype(dtype)
    return np.fromiter(draw(_column_values(kind, length)), dtype=object, count=length)  # 1-D: lists stay elements


@st.composite
def non_tensor_columns(draw: st.DrawFn, length: int, kinds: Sequence[str] = OBJECT_KINDS) -> np.ndarray:
    """One ``non_tensor_batch`` column of ``length`` rows, of a kind drawn from ``kinds``.

    Object kinds: ``"text"``, ``"ragged_lists"``, ``"ragged_arrays"`` (int64),
    ``"mixed_objects"`` (None, ints, strings, dicts); ``"numeric"``: a plain
    int32 / float64 array, 1-D or 2-D.
    """
    return _draw_column(draw, length, _check_kinds(kinds))


_BOOLS = st.booleans()
_integers = functools.cache(st.integers)


def _make_tensor(rng: np.random.Generator, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    if dtype == torch.bool:
        return torch.from_numpy(rng.random(shape) < 0.5)
    if dtype.is_complex:
        real, imag = (torch.from_numpy(rng.standard_normal(shape).astype(np.float32)) for _ in range(2))
        return torch.complex(real, imag).to(dtype)
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
    dtypes: Sequence[torch.dtype] = DEFAULT_DTYPES,
    max_tensor_keys: int = 3,
    max_dims: int = 2,
    max_side: int = 3,
    with_tensors: bool | None = True,
    with_non_tensors: bool | None = None,
    non_tensor_kinds: Sequence[str] = OBJECT_KINDS,
    max_non_tensor_keys: int = 2,
    with_meta: bool = True,
    auto_padding: bool | None = False,
) -> DataProto:
    """A DataProto of ``min_len..max_len`` rows (0 allowed).

    ``with_tensors``, ``with_non_tensors`` and ``auto_padding``: True, False or
    None (drawn); with neither kind of column, a non-tensor one carries the
    length.  Tensors have one of ``dtypes`` and per-row shapes of up to
    ``max_dims`` dims of up to ``max_side``.
    """
    if min_len < 0 or max_len < min_len:
        raise DispatchValueError(f"dataprotos needs 0 <= min_len <= max_len, got {min_len}..{max_len}")
    kinds = _check_kinds(non_tensor_kinds)
    length = draw(_integers(min_len, max_len))
    has_tensors = draw(_BOOLS) if with_tensors is None else with_tensors
    has_objects = draw(_BOOLS) if with_non_tensors is None else with_non_tensors
    has_objects = has_objects or not has_tensors
    rng = np.random.default_rng(draw(_SEEDS))

    tensors: dict[str, torch.Tensor] = {}
    if has_tensors:
        for i in range(draw(_integers(1, max(1, max_tensor_keys)))):
            dtype = draw(tensor_dtypes(dtypes))
            shape = draw(trailing_shapes(max_dims, max_side))
            tensors[f"t{i}_{str(dtype).removeprefix('torch.')}"] = _make_tensor(rng, dtype, (length, *shape))

    non_tensors: dict[str, np.ndarray] = {}
    if has_objects:
        for i in range(draw(_integers(1, max(1, max_non_tensor_keys)))):
            non_tensors[f"n{i}"] = _draw_column(draw, length, kinds)

    meta = draw(meta_infos()) if with_meta else {}
    padding = draw(_BOOLS) if auto_padding is None else auto_padding
    return DataProto.from_dict(tensors, non_tensors, meta, auto_padding=padding)
