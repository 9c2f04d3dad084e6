"""Less central DataProto methods, kept apart to keep ``_dataproto.py`` short.

:class:`DataProtoExtras` is a mixin of :class:`~dispatchcore.DataProto`:
row repetition (``repeat``, ``sample_level_repeat``, ``unfold_column_chunks``),
mini-batch iteration, persistence, size reports and tensordict conversion.
Each method only uses ``_take`` / ``type(self)`` of the host class.
"""

from __future__ import annotations

import os
import pickle
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from dispatchcore._errors import BatchSizeError
from dispatchcore._tensor_batch import TensorBatch

if TYPE_CHECKING:
    from typing import Self  # Python 3.11+; only read by type checkers

    from dispatchcore._dataproto import DataProto

__all__ = ["DataProtoExtras"]

#: ``to_tensordict`` entry giving ``{column: (dtype, row_shape)}`` for columns that are not 1-D object arrays.
_COLUMN_LAYOUT_KEY = "_dispatchcore_column_layout"


class DataProtoExtras:
    """Mixin: the parts of verl's DataProto surface that are not core row logic."""

    if TYPE_CHECKING:
        batch: TensorBatch | None
        non_tensor_batch: dict[str, np.ndarray]
        meta_info: dict[str, Any]

        def __init__(
            self,
            batch: TensorBatch | None = None,
            non_tensor_batch: Mapping[str, Any] | None = None,
            meta_info: Mapping[str, Any] | None = None,
        ) -> None: ...

        def __len__(self) -> int: ...

        def _take(self, index: np.ndarray) -> Self: ...

    @classmethod
    def from_tensordict(
        cls,
        tensor_dict: Any = None,
        meta_info: Mapping[str, Any] | None = None,
        num_batch_dims: int = 1,
    ) -> Self:
        """Build from a TensorDict laid out as :meth:`to_tensordict` writes it (needs tensordict).

        Tensors go to ``batch``, ``NonTensorStack`` entries to ``non_tensor_batch``
        and ``NonTensorData`` entries to ``meta_info`` (they win over keys of
        the ``meta_info`` argument).  Stacks are read with ``tolist()``, not
        per-element ``.data``: ``NonTensorStack.from_list`` turns list values
        into nested (ragged, possibly empty) stacks whose ``.data`` raises
        inside tensordict.
        """
        td = _import_tensordict()
        if num_batch_dims != 1:
            raise ValueError(f"only num_batch_dims=1 is supported, got {num_batch_dims}")
        if not isinstance(tensor_dict, td.TensorDictBase):
            raise TypeError(f"from_tensordict needs a tensordict.TensorDict, got {type(tensor_dict).__name__}")
        meta = dict(meta_info or {})
        tensors: dict[str, torch.Tensor] = {}
        rows: dict[str, list[Any]] = {}
        for key, value in tensor_dict.items():
            if isinstance(value, td.NonTensorStack):
                rows[key] = value.tolist()
            elif isinstance(value, td.NonTensorData):
                meta[key] = value.data
            elif isinstance(value, torch.Tensor):
                tensors[key] = value
            else:
                raise TypeError(f"from_tensordict: unsupported entry {key!r} of type {type(value).__name__}")
        layouts = meta.pop(_COLUMN_LAYOUT_KEY, None) or {}
        non_tensors = {
            key: _column_from_rows(values, *layouts.get(key, (np.dtype(object), ()))) for key, values in rows.items()
        }
        size = list(tensor_dict.batch_size[:1])
        batch = TensorBatch(tensors, batch_size=size) if tensors else None
        return cls(batch=batch, non_tensor_batch=non_tensors, meta_info=meta)

    def to_tensordict(self) -> Any:
        """A TensorDict of the tensors, non-tensor columns and meta info (needs tensordict).

        Each column becomes a 1-D ``NonTensorStack`` holding one row value per
        element, wrapped one by one so tensordict never unpacks a list or dict
        row into a nested stack.  ``meta_info`` entries become ``NonTensorData``.
        Columns that are not 1-D object arrays also record their dtype and row
        shape under ``_dispatchcore_column_layout`` so :meth:`from_tensordict`
        rebuilds them exactly; 1-D object columns (verl's kind) need no record.
        """
        td = _import_tensordict()
        tensor_keys = list(self.batch.keys()) if self.batch is not None else []
        counts = Counter([*tensor_keys, *self.non_tensor_batch, *self.meta_info, _COLUMN_LAYOUT_KEY])
        clash = sorted(str(key) for key, n in counts.items() if n > 1)
        if clash:
            raise ValueError(
                f"to_tensordict: keys {clash} appear in more than one of batch, non_tensor_batch, meta_info "
                f"(or are the reserved {_COLUMN_LAYOUT_KEY!r}); one TensorDict holds them all"
            )
        out = td.TensorDict(
            self.batch.to_dict() if self.batch is not None else {},
            batch_size=[len(self)],
        )
        layouts: dict[str, tuple[np.dtype[Any], tuple[int, ...]]] = {}
        for key, column in self.non_tensor_batch.items():
            if column.dtype != object or column.ndim != 1:
                layouts[key] = (column.dtype, column.shape[1:])
            out[key] = td.NonTensorStack(*[td.NonTensorData(data=row) for row in column])
        for key, value in self.meta_info.items():
            out.set_non_tensor(key, value)
        if layouts:
            out.set_non_tensor(_COLUMN_LAYOUT_KEY, layouts)
        return out

    def print_size(self, prefix: str = "") -> None:
        """Print the tensor and numpy sizes in GB (verl's format)."""
        tensor_bytes = sum(t.element_size() * t.numel() for t in (self.batch.values() if self.batch else ()))
        numpy_bytes = sum(a.nbytes for a in self.non_tensor_batch.values())
        message = (
            f"Size of tensordict: {tensor_bytes / 1024**3} GB, size of non_tensor_batch: {numpy_bytes / 1024**3} GB"
        )
        print(f"{prefix}, {message}" if prefix else message)

    def get_data_info(self) -> str:
        """A readable listing of columns (shape, dtype, device) and meta types."""
        lines = ["batch"]
        for key, t in self.batch.items() if self.batch is not None else ():
            lines.append(f"  {key}: {tuple(t.shape)} ({t.dtype}) {t.device}")
        lines.append("non_tensor_batch")
        lines += [f"  {k}: ndarray{a.shape} ({a.dtype})" for k, a in self.non_tensor_batch.items()]
        lines.append("meta_info")
        lines += [f"  {k}: {type(v).__name__}" for k, v in self.meta_info.items()]
        return "\n".join(lines)

    def repeat(self, repeat_times: int = 2, interleave: bool = True) -> Self:
        """Each row ``repeat_times`` times: ``aabb`` (interleave) or ``abab``."""
        if repeat_times < 0:
            raise ValueError(f"repeat_times must be >= 0, got {repeat_times}")
        length = len(self)
        if interleave:
            index = np.repeat(np.arange(length), repeat_times)
        else:
            index = np.tile(np.arange(length), repeat_times)
        return self._take(index)

    def sample_level_repeat(self, repeat_times: Sequence[int] | np.ndarray | torch.Tensor) -> Self:
        """Row i repeated ``repeat_times[i]`` times (interleaved)."""
        if isinstance(repeat_times, torch.Tensor):
            counts = repeat_times.detach().cpu().numpy()
        else:
            counts = np.asarray(list(repeat_times) if isinstance(repeat_times, tuple) else repeat_times)
        if counts.ndim != 1 or counts.shape[0] != len(self):
            raise BatchSizeError(f"repeat_times has shape {counts.shape}; expected ({len(self)},)")
        if counts.size and counts.min() < 0:
            raise ValueError("repeat_times must be >= 0")
        return self._take(np.repeat(np.arange(len(self)), counts.astype(np.int64)))

    def unfold_column_chunks(self, n_split: int, split_keys: list[str] | None = None) -> Self:
        """Split dim 1 of ``split_keys`` into ``n_split`` rows each; other columns repeat."""
        keys = set(split_keys or ())

        def unfold(value: Any) -> Any:
            if value.shape[1] % n_split:
                raise BatchSizeError(f"dim 1 of size {value.shape[1]} does not divide by n_split={n_split}")
            return value.reshape(value.shape[0] * n_split, value.shape[1] // n_split, *value.shape[2:])

        batch = None
        if self.batch is not None:
            tensors = {
                k: unfold(v) if k in keys else v.repeat_interleave(n_split, dim=0) for k, v in self.batch.items()
            }
            batch = TensorBatch(tensors, batch_size=[len(self) * n_split])
        non_tensor = {
            k: unfold(v) if k in keys else np.repeat(v, n_split, axis=0) for k, v in self.non_tensor_batch.items()
        }
        return type(self)(batch=batch, non_tensor_batch=non_tensor, meta_info=dict(self.meta_info))

    def make_iterator(
        self,
        mini_batch_size: int,
        epochs: int,
        seed: int | None = None,
        dataloader_kwargs: dict[str, Any] | None = None,
    ) -> Iterator[Self]:
        """Yield mini-batches of ``mini_batch_size`` rows for ``epochs`` epochs.

        ``dataloader_kwargs`` go to ``torch.utils.data.DataLoader`` (e.g.
        ``shuffle=True``); ``seed`` seeds its generator.
        """
        from torch.utils.data import DataLoader

        if mini_batch_size <= 0 or len(self) % mini_batch_size:
            raise BatchSizeError(
                f"make_iterator needs mini_batch_size dividing the length: {len(self)} % {mini_batch_size} != 0"
            )
        kwargs = dict(dataloader_kwargs or {})
        generator = None
        if seed is not None:
            generator = torch.Generator()
            generator.manual_seed(seed)
        rows: Any = range(len(self))  # a map-style dataset of row numbers
        loader: DataLoader[int] = DataLoader(
            rows,
            batch_size=mini_batch_size,
            collate_fn=_index_collate,
            generator=generator,
            **kwargs,
        )

        def batches() -> Iterator[Self]:
            for _ in range(epochs):
                for index in loader:
                    yield self._take(index)

        return batches()

    def save_to_disk(self, filepath: str | os.PathLike[str]) -> None:
        """Pickle self to ``filepath``."""
        with open(filepath, "wb") as f:
            pickle.dump(self, f, protocol=pickle.HIGHEST_PROTOCOL)

    @staticmethod
    def load_from_disk(filepath: str | os.PathLike[str]) -> DataProto:
        """Read a DataProto written by :meth:`save_to_disk`."""
        with open(filepath, "rb") as f:
            return pickle.load(f)


def _index_collate(indices: list[int]) -> np.ndarray:
    return np.asarray(indices, dtype=np.int64)


def _column_from_rows(rows: list[Any], dtype: np.dtype[Any], row_shape: tuple[int, ...]) -> np.ndarray:
    """A column of ``rows``; object rows are set one by one so numpy never unpacks a list row."""
    column = np.empty((len(rows), *row_shape), dtype=dtype)
    if column.dtype == object:
        for i, row in enumerate(rows):
            column[i] = row
    elif rows:
        column[...] = rows
    return column


def _import_tensordict() -> Any:
    """tensordict, imported on use: it is an optional dependency."""
    try:
        import tensordict
    except ImportError as exc:
        raise ImportError("DataProto.from_tensordict / to_tensordict need tensordict: pip install tensordict") from exc
    return tensordict
