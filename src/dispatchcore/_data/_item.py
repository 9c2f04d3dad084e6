"""``DataProtoItem``: one row of a ``DataProto``, what ``data[i]`` returns (verl's shape)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ._tensor_batch import TensorBatch


@dataclass
class DataProtoItem:
    """One row of a DataProto: what ``data[i]`` returns (verl's shape)."""

    batch: TensorBatch | None = None
    non_tensor_batch: dict[str, Any] = field(default_factory=dict)
    meta_info: dict[str, Any] = field(default_factory=dict)
