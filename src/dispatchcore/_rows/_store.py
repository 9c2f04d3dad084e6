"""Rows a rank keeps instead of returning them: the rank side of lazy results.

Keys are driver-made and unique to a call and rank, so groups sharing a process never see each other's rows.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np
import torch

from .._base import DispatchError
from .._data import DataProto
from ._records import ColumnSpec, HeldRows, RowRequest


class RowStore:
    """Kept results of this process, by key (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[str, DataProto] = {}

    def keep(self, key: str, data: DataProto) -> HeldRows:
        """Keep ``data`` under ``key``; return its description."""
        columns: dict[str, ColumnSpec] = {}
        if data.batch is not None:
            columns.update((name, ColumnSpec.of(t)) for name, t in data.batch.items())
        columns.update((name, ColumnSpec.of(a)) for name, a in data.non_tensor_batch.items())
        with self._lock:
            self._held[key] = data
        return HeldRows(key, len(data), columns, dict(data.meta_info), data.batch is not None)

    def has(self, key: str) -> bool:
        return key in self._held

    def take(self, request: RowRequest) -> DataProto:
        """The requested rows and columns as views of the kept result (no ``meta_info``)."""
        data = self._held.get(request.key)
        if data is None:
            raise DispatchError(
                f"rows {request.key!r} of rank {request.rank} are no longer held: the lazy result was freed "
                "(no reference to it was left on the driver) or its rank was restarted"
            )
        return take_rows(data, request.columns, request.index)

    def free(self, keys: Sequence[str]) -> None:
        with self._lock:
            for key in keys:
                self._held.pop(key, None)

    def __len__(self) -> int:
        return len(self._held)


def take_rows(data: DataProto, columns: Sequence[str], index: slice | np.ndarray) -> DataProto:
    """``columns`` of ``data`` at rows ``index``: views for a slice, a gathered copy for an array."""
    tensors: dict[str, torch.Tensor] = {}
    arrays: dict[str, np.ndarray] = {}
    for name in columns:
        if data.batch is not None and name in data.batch.keys():
            column = data.batch[name]
            tensors[name] = column[index] if isinstance(index, slice) else column[torch.from_numpy(index)]
        else:
            arrays[name] = data.non_tensor_batch[name][index]
    return DataProto(batch=tensors or None, non_tensor_batch=arrays)


#: This process's kept results (ranks of every group living here share it; keys never collide).
ROW_STORE = RowStore()


def take_kept_rows(request: RowRequest) -> DataProto:
    """Producing rank: the rows ``request`` asks for, as views or a gathered copy (``DispatchError`` once freed)."""
    return ROW_STORE.take(request)


def free_kept_rows(keys: Sequence[str]) -> None:
    """Producing rank: drop the rows kept under ``keys`` (a key already gone is skipped)."""
    ROW_STORE.free(keys)


def kept_results() -> int:
    """How many lazy results this process keeps (for tests and diagnostics: 0 once every key was freed)."""
    return len(ROW_STORE)


def holds_kept_rows(key: str) -> bool:
    """Whether this process keeps the rows under ``key`` (then no transport is needed)."""
    return ROW_STORE.has(key)
