"""What the row helpers need of a ``DataProto`` (which calls them, so they cannot import it), and shared keys."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, Self

import numpy as np

from dispatchcore._base._errors import DispatchTypeError, DispatchValueError

#: ``meta_info`` key of a chunk: how many of its trailing rows are padding.
PADDING_ROWS_KEY = "padding_rows"
#: ``meta_info`` flag set by ``auto_padding=True`` (verl's key, so verl data keeps working).
AUTO_PADDING_KEY = "_verl_auto_padding"


class RowItem(Protocol):
    """One row as ``data[i]`` returns it (a ``DataProtoItem``)."""

    batch: Any
    non_tensor_batch: dict[str, Any]


class RowsLike(Protocol):
    """A batch of rows: tensor columns, object columns and ``meta_info`` of one length."""

    non_tensor_batch: dict[str, np.ndarray]
    meta_info: dict[str, Any]

    def __init__(
        self,
        batch: Any = None,
        non_tensor_batch: Mapping[str, Any] | None = None,
        meta_info: Mapping[str, Any] | None = None,
    ) -> None: ...
    @property
    def batch(self) -> Any: ...  # a TensorBatch (the helpers import that class themselves)
    def __len__(self) -> int: ...
    def __getitem__(self, item: Any) -> Any: ...
    def is_padding_enabled(self) -> bool: ...
    def _take(self, index: Any) -> Self: ...
    def _new(
        self,
        batch: Any,
        non_tensor: dict[str, np.ndarray],
        meta: dict[str, Any],
    ) -> Self: ...


def check_positive(name: str, value: Any) -> int:
    """``value`` as an int, or a TypeError / ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise DispatchTypeError(f"{name} must be an int, got {type(value).__name__}")
    if value <= 0:
        raise DispatchValueError(f"{name} must be positive, got {value}")
    return int(value)
