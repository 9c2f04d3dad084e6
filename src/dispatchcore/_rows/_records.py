"""Kept rows described without the rows: plain records that cross processes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

#: What a core call reading or freeing kept rows is called in errors and traces (it names no worker method).
ROWS_CALL = "<kept rows>"


@dataclass(frozen=True)
class ColumnSpec:
    """One column's type: a tensor's dtype, per-row shape and device, or a numpy column's dtype."""

    tensor: bool
    dtype: Any
    shape: tuple[int, ...]
    device: str = "cpu"

    @classmethod
    def of(cls, value: Any) -> ColumnSpec:
        if isinstance(value, torch.Tensor):
            return cls(True, value.dtype, tuple(value.shape[1:]), str(value.device))
        return cls(False, value.dtype, tuple(value.shape[1:]))

    def empty(self, length: int, device: str = "cpu") -> Any:
        """An uninitialised column of ``length`` rows of this type."""
        if self.tensor:
            return torch.empty((length, *self.shape), dtype=self.dtype, device=device)
        return np.empty((length, *self.shape), dtype=self.dtype)

    def row_bytes(self) -> int:
        """Bytes one row takes (object columns count their pointers only)."""
        count = 1
        for dim in self.shape:
            count *= dim
        size = self.dtype.itemsize if self.tensor else np.dtype(self.dtype).itemsize
        return int(count * size)


@dataclass(frozen=True)
class HeldRows:
    """What a rank sends back for a kept result: everything but the rows."""

    key: str
    rows: int
    columns: dict[str, ColumnSpec]
    meta_info: dict[str, Any] = field(default_factory=dict)
    #: Whether the result had a tensor batch (a DataProto without one has ``batch is None``).
    has_batch: bool = True

    @property
    def nbytes(self) -> int:
        return sum(spec.row_bytes() for spec in self.columns.values()) * self.rows


@dataclass(frozen=True)
class RowRequest:
    """Rows ``index`` of ``columns`` of the result kept under ``key`` at ``address`` (``row_address``)."""

    address: Any
    rank: int
    key: str
    columns: tuple[str, ...]
    index: slice | np.ndarray


@dataclass(frozen=True)
class RowAccess:
    """A driver's visit to one rank's kept rows, the beside calls' argument: free ``free``, read ``requests``."""

    requests: tuple[RowRequest, ...] = ()
    free: tuple[str, ...] = ()
