"""What the row helpers need of a ``DataProto``, as a protocol.

``DataProto``'s methods call the helpers (padding, reshaping, mini-batches,
tensordict interop), so the helpers cannot import the class, not even for a
type: they program against :class:`RowsLike`, which ``DataProto`` (and any
subclass, ``LazyDataProto`` included) satisfies.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, Self

import numpy as np
import torch

from ._tensor_batch import TensorBatch


class RowsLike(Protocol):
    """A batch of rows: tensor columns, object columns and ``meta_info`` of one length."""

    non_tensor_batch: dict[str, np.ndarray]
    meta_info: dict[str, Any]

    def __init__(
        self,
        batch: TensorBatch | Mapping[str, torch.Tensor] | None = None,
        non_tensor_batch: Mapping[str, Any] | None = None,
        meta_info: Mapping[str, Any] | None = None,
    ) -> None: ...
    @property
    def batch(self) -> TensorBatch: ...
    def __len__(self) -> int: ...
    def __getitem__(self, item: Any) -> Any: ...
    def is_padding_enabled(self) -> bool: ...
    def _take(self, index: Any) -> Self: ...
    def _new(
        self,
        batch: TensorBatch | None,
        non_tensor: dict[str, np.ndarray],
        meta: dict[str, Any],
    ) -> Self: ...


@dataclass
class DataProtoItem:
    """One row of a DataProto: what ``data[i]`` returns (verl's shape)."""

    batch: TensorBatch | None = None
    non_tensor_batch: dict[str, Any] = field(default_factory=dict)
    meta_info: dict[str, Any] = field(default_factory=dict)


def check_positive(name: str, value: Any) -> int:
    """``value`` as an int, or a TypeError / ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value <= 0:
        raise ValueError(f"{name} must be positive, got {value}")
    return int(value)
