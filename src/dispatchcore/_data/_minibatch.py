"""Mini-batches through torch's DataLoader: iterating a DataProto and collating rows (the class is passed in)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, TypeVar

import numpy as np
import torch

from dispatchcore._base._errors import BatchSizeError
from dispatchcore._data._rows_like import RowItem, RowsLike
from dispatchcore._data._tensor_batch import TensorBatch

__all__ = ["collate_rows", "iterate_minibatches"]

D = TypeVar("D", bound=RowsLike)


def iterate_minibatches(
    data: D,
    mini_batch_size: int,
    epochs: int,
    seed: int | None = None,
    dataloader_kwargs: dict[str, Any] | None = None,
) -> Iterator[D]:
    """Mini-batches of ``mini_batch_size`` rows of ``data`` for ``epochs`` epochs, through a ``DataLoader``."""
    from torch.utils.data import DataLoader

    if mini_batch_size <= 0 or len(data) % mini_batch_size:
        raise BatchSizeError(
            f"make_iterator needs mini_batch_size dividing the length: {len(data)} % {mini_batch_size} != 0"
        )
    kwargs = dict(dataloader_kwargs or {})
    generator = None if seed is None else torch.Generator().manual_seed(seed)
    rows: Any = range(len(data))  # a map-style dataset of row numbers
    loader: DataLoader[int] = DataLoader(
        rows,
        batch_size=mini_batch_size,
        collate_fn=_index_collate,
        generator=generator,
        **kwargs,
    )

    def batches() -> Iterator[D]:
        for _ in range(epochs):
            for index in loader:
                yield data._take(index)

    return batches()


def collate_rows(items: Sequence[RowItem], cls: type[D]) -> D:
    """Stack row items back into a ``cls`` (non-tensors become object arrays, as in verl)."""
    batch = None
    rows = [item.batch for item in items]
    if rows and all(r is not None for r in rows):
        batch = TensorBatch.stack(rows).contiguous()
    keys: list[str] = list(items[0].non_tensor_batch) if items else []
    non_tensor = {key: _stack_column([item.non_tensor_batch[key] for item in items]) for key in keys}
    return cls(batch=batch, non_tensor_batch=non_tensor)


def _index_collate(indices: list[int]) -> np.ndarray:
    return np.asarray(indices, dtype=np.int64)


def _stack_column(values: list[Any]) -> np.ndarray:
    """Rows of one non-tensor column back into an array, keeping numeric dtypes."""
    if values and all(isinstance(v, np.ndarray) for v in values):
        return np.stack(values)
    if values and all(isinstance(v, np.generic) and not isinstance(v, np.object_) for v in values):
        return np.array(values)
    column = np.empty(len(values), dtype=object)
    for i, value in enumerate(values):
        column[i] = value
    return column
