"""Padding: the auto-padding switch, and splitting rows into equal chunks.

Every chunk records how many trailing rows are padding (:data:`PADDING_ROWS_KEY`) so results can be trimmed.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TypeVar

import numpy as np
import torch

from dispatchcore._base._errors import BatchSizeError, DispatchTypeError, DispatchValueError
from dispatchcore._data._rows_like import AUTO_PADDING_KEY, PADDING_ROWS_KEY, RowsLike, check_positive
from dispatchcore._data._tensor_batch import made_batch

__all__ = [
    "AUTO_PADDING_KEY",
    "PADDING_ROWS_KEY",
    "DataProtoConfig",
    "check_positive",
    "chunk_with_padding",
    "kept_result_rows",
    "pad_dataproto_to_divisor",
    "real_rows",
    "split_views",
    "unpad_dataproto",
]

D = TypeVar("D", bound=RowsLike)

_ENV_FLAGS = ("DISPATCHCORE_AUTO_PADDING", "VERL_AUTO_PADDING")


class _DataProtoConfigMeta(type):
    _auto_padding = False

    @property
    def auto_padding(cls) -> bool:
        """Process-wide padding switch; also on when an env flag is TRUE/1."""
        env = any(os.getenv(name, "").upper() in ("TRUE", "1") for name in _ENV_FLAGS)
        return env or cls._auto_padding

    @auto_padding.setter
    def auto_padding(cls, enabled: bool) -> None:
        if not isinstance(enabled, bool):
            raise DispatchTypeError(f"auto_padding must be a bool, got {type(enabled).__name__}")
        cls._auto_padding = enabled


class DataProtoConfig(metaclass=_DataProtoConfigMeta):
    """Global DataProto settings (verl's name): ``DataProtoConfig.auto_padding = True``."""

    auto_padding_key = AUTO_PADDING_KEY


def pad_dataproto_to_divisor(data: D, size_divisor: int) -> tuple[D, int]:
    """Pad ``data`` (never in place) to a multiple of ``size_divisor``, repeating rows 0, 1, ...: ``(padded, pad)``."""
    divisor = check_positive("size_divisor", size_divisor)
    length = len(data)
    pad_size = (-length) % divisor
    if pad_size == 0:
        return data[:], 0
    return data._take(np.arange(length + pad_size) % length), pad_size


def unpad_dataproto(data: D, pad_size: int) -> D:
    """Drop the last ``pad_size`` rows (``data[:-pad_size]``); a view."""
    if pad_size < 0:
        raise DispatchValueError(f"pad_size must be >= 0, got {pad_size}")
    if pad_size > len(data):
        raise BatchSizeError(f"cannot remove {pad_size} padding rows from a DataProto of length {len(data)}")
    return data[: len(data) - pad_size] if pad_size else data


def real_rows(data: RowsLike) -> int:
    """How many of ``data``'s rows are real (what a padded chunk's loss is normalised by): its length less padding."""
    return len(data) - (_existing_padding(data) or 0)


def _padding_rows_in(start: int, stop: int, real_end: int) -> int:
    """How many of virtual rows ``[start, stop)`` lie at or past ``real_end``."""
    return max(0, min(stop - start, stop - real_end))


def kept_result_rows(lengths: Sequence[int], pad_size: int, padded_len: int, ranks: Sequence[int] | None = None) -> int:
    """How many leading rows of the ranks' concatenated results are real, judged rank by rank.

    Rank ``i`` was sent ``L = padded_len / len(lengths)`` rows, ``p`` of them padding (only trailing ranks
    have any).  It may return ``L`` rows (``p`` are trimmed), ``k * L`` rows (``k`` results per row, each
    row's together: ``k * p`` trimmed), or only its ``L - p`` real rows (kept whole); a rank sent no padding
    may return any count.  Padding lies in trailing rows of trailing ranks, so what is kept is always a
    prefix.  Any other count is refused, naming the rank (``ranks[i]``) and the counts: a guess would lose
    or keep rows without a word.
    """
    total = sum(lengths)
    n = len(lengths)
    if pad_size <= 0 or n == 0 or padded_len % n:
        return total
    size = padded_len // n
    real_end = padded_len - pad_size
    keep = 0
    for i, got in enumerate(lengths):
        pad = _padding_rows_in(i * size, (i + 1) * size, real_end)
        if pad == 0 or got == size - pad:
            keep += got
        elif got > 0 and got % size == 0:
            keep += got - got // size * pad
        else:
            rank = i if ranks is None else ranks[i]
            raise BatchSizeError(
                f"rank {rank} was sent {size} rows, the last {pad} of them padding (auto_padding), and returned "
                f"{got}: the padding rows cannot be told apart. Return one row per row sent ({size}; the "
                f"padding is trimmed), k rows per row sent, each row's k together (k*{size}), or only the "
                f"{size - pad} real rows (meta_info[{PADDING_ROWS_KEY!r}] says how many to drop)"
            )
    return keep


def _existing_padding(data: RowsLike) -> int | None:
    value = data.meta_info.get(PADDING_ROWS_KEY)
    if value is None:
        return None
    if not isinstance(value, int | np.integer) or not 0 <= value <= len(data):
        raise BatchSizeError(
            f"meta_info[{PADDING_ROWS_KEY!r}]={value!r} is not a row count within 0..{len(data)}; "
            f"it says how many trailing rows are padding: set it to such a count or delete the key"
        )
    return int(value)


def chunk_with_padding(data: D, n: int, allow_padding: bool | None = None) -> tuple[list[D], int]:
    """Split ``data`` into ``n`` equal chunks, padding when allowed; returns ``(chunks, pad_size)``.

    ``allow_padding=None`` means ``data.is_padding_enabled()``; without padding a length ``n`` does not divide
    raises.  Every chunk's ``meta_info`` carries :data:`PADDING_ROWS_KEY` when padding is allowed or present.
    """
    n = check_positive("chunks", n)
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
    if pad_size == 0 and size and type(data).__name__ == "DataProto" and data.batch is not None:
        chunks = _even_views(data, n, size)
        if mark:
            for i, piece in enumerate(chunks):
                piece.meta_info[PADDING_ROWS_KEY] = _padding_rows_in(i * size, (i + 1) * size, real_end)
        return chunks, 0
    chunks = []
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


def _even_views(data: D, n: int, size: int) -> list[D]:
    """``n`` views of ``size`` rows each: one split per column instead of ``n`` slices of every column."""
    batch = data.batch
    if len(batch.batch_size) != 1:
        return [data[i * size : (i + 1) * size] for i in range(n)]
    # Tensor.chunk is torch's C split (torch.split adds a Python wrapper); n divides the length.
    columns = [(k, t.chunk(n)) for k, t in batch._tensors.items()]
    arrays = data.non_tensor_batch
    meta = data.meta_info
    row_size = torch.Size([size])
    out: list[D] = []
    for i in range(n):
        part = made_batch(row_size, {k: pieces[i] for k, pieces in columns})
        rows = {k: a[i * size : (i + 1) * size] for k, a in arrays.items()} if arrays else {}
        out.append(data._new(part, rows, dict(meta)))
    return out


def split_views(data: D, split_size: int) -> list[D]:
    """``data`` in consecutive views of ``split_size`` rows (the last may be short)."""
    split_size = check_positive("split_size", split_size)
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
