"""``DataProto``: verl's batch container, without tensordict or Ray.

verl 0.9.1's method names, arguments and defaults (verl code ports by changing imports), sharp edges fixed.
"""

from __future__ import annotations

import copy
import copyreg
import os
import pickle
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, SupportsIndex, cast

import numpy as np
import torch

from dispatchcore._base._errors import (
    BatchSizeError,
    DispatchIndexError,
    DispatchKeyError,
    DispatchTypeError,
    DispatchValueError,
)
from dispatchcore._data._coerce import as_batch, as_column, as_index, not_a_dataproto
from dispatchcore._data._item import DataProtoItem
from dispatchcore._data._meta_info import merge_meta_info, union_numpy_dict, union_tensor_dict, union_two_dict
from dispatchcore._data._minibatch import collate_rows, iterate_minibatches
from dispatchcore._data._padding import AUTO_PADDING_KEY, DataProtoConfig, chunk_with_padding, split_views
from dispatchcore._data._reshape import repeat_rows, repeat_rows_per_sample, unfold_column_chunks
from dispatchcore._data._tensor_batch import TensorBatch, batch_from_state, batch_state
from dispatchcore._data._tensordict_interop import from_tensordict, to_tensordict
from dispatchcore._wire._buffers import RowBuffers

if TYPE_CHECKING:
    from typing import Self  # Python 3.11+; only read by type checkers

__all__ = [
    "DataProto",
    "DataProtoConfig",  # defined in _padding; re-exported for verl-style imports
    "DataProtoItem",
    "collate_fn",
]


class DataProto:
    """Tensors, non-tensor columns and meta info for one batch of rows."""

    #: True on a ``LazyDataProto`` (rows kept on ranks); a class attribute, so checking it costs no lookup miss.
    is_lazy: ClassVar[bool] = False

    def __init__(
        self,
        batch: TensorBatch | Mapping[str, torch.Tensor] | None = None,
        non_tensor_batch: Mapping[str, Any] | None = None,
        meta_info: Mapping[str, Any] | None = None,
    ) -> None:
        self.batch = batch
        self.non_tensor_batch = {k: as_column(k, v) for k, v in (non_tensor_batch or {}).items()}
        self.meta_info = dict(meta_info or {})
        self.check_consistency()

    @property
    def batch(self) -> TensorBatch:
        """The tensors (a TensorBatch, or ``None``); assigning a TensorDict or dict converts it."""
        return self._batch  # type: ignore[return-value]

    @batch.setter
    def batch(self, value: Any) -> None:
        self._batch = as_batch(value)

    @classmethod
    def from_dict(
        cls,
        tensors: Mapping[str, torch.Tensor] | None = None,
        non_tensors: Mapping[str, Any] | None = None,
        meta_info: Mapping[str, Any] | None = None,
        auto_padding: bool = False,
        *,
        num_batch_dims: int = 1,
    ) -> Self:
        """Build from column dicts; every column must have the same length."""
        if num_batch_dims != 1:
            raise DispatchValueError(f"only num_batch_dims=1 is supported, got {num_batch_dims}")
        tensors = dict(tensors or {})
        non_tensors = {k: as_column(k, v) for k, v in (non_tensors or {}).items()}
        lengths = {f"tensors[{k!r}]": (v.shape[0] if v.dim() else None) for k, v in tensors.items()}
        lengths.update({f"non_tensors[{k!r}]": (v.shape[0] if v.ndim else None) for k, v in non_tensors.items()})
        if len(set(lengths.values())) > 1 or None in lengths.values():
            listed = ", ".join(f"{k}: {'scalar' if n is None else n}" for k, n in lengths.items())
            raise BatchSizeError(f"DataProto.from_dict: columns must share their first dim; got {listed}")
        batch = TensorBatch(tensors) if tensors else None
        meta = {**(meta_info or {}), AUTO_PADDING_KEY: True} if auto_padding else dict(meta_info or {})
        return cls(batch=batch, non_tensor_batch=non_tensors, meta_info=meta)

    @classmethod
    def from_single_dict(
        cls,
        data: Mapping[str, torch.Tensor | np.ndarray],
        meta_info: Mapping[str, Any] | None = None,
        auto_padding: bool = False,
    ) -> Self:
        """Build from one dict: tensors go to ``batch``, numpy arrays to ``non_tensor_batch``."""
        tensors: dict[str, torch.Tensor] = {}
        non_tensors: dict[str, np.ndarray] = {}
        for key, value in data.items():
            if isinstance(value, torch.Tensor):
                tensors[key] = value
            elif isinstance(value, np.ndarray):
                non_tensors[key] = value
            else:
                raise DispatchTypeError(
                    f"from_single_dict: {key!r} is a {type(value).__name__}, not a tensor or ndarray"
                )
        return cls.from_dict(tensors, non_tensors, meta_info, auto_padding=auto_padding)

    @classmethod
    def from_tensordict(
        cls,
        tensor_dict: Any = None,
        meta_info: Mapping[str, Any] | None = None,
        num_batch_dims: int = 1,
    ) -> Self:
        """Build from a TensorDict laid out as :meth:`to_tensordict` writes it (needs tensordict)."""
        return from_tensordict(cls, tensor_dict, meta_info, num_batch_dims)

    def check_consistency(self) -> None:
        """Raise if columns disagree on the row count (public, as in verl)."""
        if self.batch is not None and self.batch.batch_dims != 1:
            raise BatchSizeError(
                f"DataProto.batch must have exactly one batch dim, got batch_size {list(self.batch.batch_size)}"
            )
        expected = len(self.batch) if self.batch is not None else None
        for key, value in self.non_tensor_batch.items():
            if not isinstance(value, np.ndarray):
                raise DispatchTypeError(f"non_tensor_batch[{key!r}] must be a numpy array, got {type(value).__name__}")
            if value.ndim == 0:
                raise BatchSizeError(f"non_tensor_batch[{key!r}] is 0-dimensional; it needs one row per item")
            if expected is None:
                expected = value.shape[0]
            elif value.shape[0] != expected:
                sizes = {k: v.shape[0] for k, v in self.non_tensor_batch.items()}
                head = f"batch size {len(self.batch)}, " if self.batch is not None else ""
                raise BatchSizeError(f"non_tensor_batch[{key!r}] has {value.shape[0]} rows; {head}columns: {sizes}")

    def __len__(self) -> int:
        if self.batch is not None:
            return len(self.batch)
        for value in self.non_tensor_batch.values():
            return int(value.shape[0])
        return 0

    def is_padding_enabled(self) -> bool:
        """True when this DataProto or :class:`DataProtoConfig` turned auto-padding on."""
        return bool(self.meta_info.get(AUTO_PADDING_KEY, False)) or DataProtoConfig.auto_padding

    def __repr__(self) -> str:
        keys = list(self.batch.keys()) if self.batch is not None else None
        return (
            f"{type(self).__name__}(len={len(self)}, batch_keys={keys}, "
            f"non_tensor_keys={list(self.non_tensor_batch)}, meta_keys={list(self.meta_info)})"
        )

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

    def _new(
        self,
        batch: TensorBatch | None,
        non_tensor: dict[str, np.ndarray],
        meta: dict[str, Any],
    ) -> Self:
        """A sibling of the same class, skipping the checks (rows already agree)."""
        out = type(self).__new__(type(self))
        out._batch = batch
        out.non_tensor_batch = non_tensor
        out.meta_info = meta
        return out

    def __getitem__(self, item: Any) -> Any:
        """int -> DataProtoItem; slice -> view; int/bool list, array or tensor -> gathered copy."""
        if isinstance(item, slice):
            return self.slice(item.start, item.stop, item.step)
        if isinstance(item, bool | np.bool_):
            raise DispatchTypeError(f"cannot index a DataProto with a bool ({item!r}); use a bool mask")
        if isinstance(item, (np.ndarray, torch.Tensor)) and item.ndim == 0:
            item = item.item()
            if isinstance(item, float):
                raise DispatchTypeError("cannot index a DataProto with a float scalar")
        if isinstance(item, int | np.integer):
            length = len(self)
            if not -length <= item < length:
                raise DispatchIndexError(f"row {item} is out of range for a DataProto of length {length}")
            row = int(item) % length
            batch = self.batch[row] if self.batch is not None else None
            return DataProtoItem(batch, {k: v[row] for k, v in self.non_tensor_batch.items()}, self.meta_info)
        if isinstance(item, list | tuple | np.ndarray | torch.Tensor):
            return self.select_idxs(item)
        raise DispatchTypeError(f"indexing a DataProto with {type(item).__name__} is not supported")

    def slice(self, start: int | None = None, end: int | None = None, step: int | None = None) -> Self:
        """Rows ``start:end:step`` as views (negative steps gather a copy)."""
        sl = slice(start, end, step)
        if step is not None and step <= 0:
            return self._take(np.arange(len(self))[sl])
        return self._rows_at(sl, sl)

    def _take(self, index: np.ndarray) -> Self:
        """Rows at ``index`` (int array) as a gathered copy."""
        return self._rows_at(*as_index(index))

    def _rows_at(self, tensor_index: Any, numpy_index: Any) -> Self:
        batch = self.batch[tensor_index] if self.batch is not None else None
        non_tensor = {k: v[numpy_index] for k, v in self.non_tensor_batch.items()}
        return self._new(batch, non_tensor, dict(self.meta_info))

    def select_idxs(self, idxs: Sequence[int] | np.ndarray | torch.Tensor) -> Self:
        """Rows picked by an int index or bool mask (list, numpy array or tensor)."""
        idx_t, idx_np = as_index(idxs, len(self))
        if self.batch is not None and self.batch.device is not None and self.batch.device.type != "cpu":
            idx_t = idx_t.to(self.batch.device)
        return self._rows_at(idx_t, idx_np)

    def chunk(self, chunks: int) -> list[Self]:
        """``chunks`` equal parts (views), padding first when enabled; else a length that does not divide raises."""
        return chunk_with_padding(self, chunks)[0]

    def split(self, split_size: int) -> list[Self]:
        """Consecutive views of ``split_size`` rows; the last may be shorter."""
        return split_views(self, split_size)

    @staticmethod
    def concat(data: Iterable[DataProto], *, row_buffers: RowBuffers | None = None) -> DataProto:
        """Join rows of several DataProtos (one copy per column).

        ``meta_info["metrics"]`` is gathered into lists per key; other meta keys
        must agree.  Rows lying in order in one of ``row_buffers`` (an
        executor's ``CallHandle.row_buffers``) are adopted instead of copied.
        """
        items = list(data)
        if not items:
            raise BatchSizeError("DataProto.concat got an empty list; there is nothing to concatenate")
        lazy = None
        for pos, item in enumerate(items):
            if not isinstance(item, DataProto):
                raise DispatchTypeError(f"DataProto.concat: item {pos} is a {type(item).__name__}, not a DataProto")
            if lazy is None and item.is_lazy:
                lazy = item
        if lazy is not None:  # rows kept on ranks: join the plans only (LazyDataProto.concat_lazy)
            return type(lazy).concat_lazy(items)  # type: ignore[attr-defined, no-any-return]
        batches = [item._batch for item in items]
        missing = [i for i, b in enumerate(batches) if b is None]
        if missing and len(missing) < len(items):
            raise DispatchValueError(
                f"DataProto.concat: items {missing} have no tensor batch while items "
                f"{[i for i, b in enumerate(batches) if b is not None]} do"
            )
        batch = None if missing else TensorBatch.cat(cast(list[TensorBatch], batches), row_buffers=row_buffers)
        first_keys = items[0].non_tensor_batch.keys()
        for pos, item in enumerate(items[1:], start=1):
            if item.non_tensor_batch.keys() != first_keys:  # keys views compare as sets, without copying
                raise DispatchValueError(
                    f"DataProto.concat: non_tensor_batch keys differ: item 0 has {sorted(first_keys)}, "
                    f"item {pos} has {sorted(item.non_tensor_batch)}"
                )
        non_tensor = {k: np.concatenate([item.non_tensor_batch[k] for item in items], axis=0) for k in first_keys}
        meta = merge_meta_info([item.meta_info for item in items])
        cls = type(items[0])
        if cls is DataProto:  # columns of one dtype per key, joined above: skip the constructor's conversions
            out = items[0]._new(batch, non_tensor, meta)
            out.check_consistency()
            return out
        return cls(batch=batch, non_tensor_batch=non_tensor, meta_info=meta)

    def padding(self, padding_size: int, padding_candidate: str = "") -> None:
        """Append ``padding_size`` copies of the first (``"first"``) or last row, in place (verl)."""
        if padding_size == 0:
            return
        if padding_size < 0:
            raise DispatchValueError(f"padding_size must be >= 0, got {padding_size}")
        if len(self) == 0:
            raise BatchSizeError("cannot pad an empty DataProto: there is no row to repeat")
        row = 0 if padding_candidate == "first" else len(self) - 1
        self._assume_rows(self._take(np.concatenate([np.arange(len(self)), np.full(padding_size, row)])))

    def _assume_rows(self, other: Self) -> None:
        """Take ``other``'s rows of the same columns, in place (``padding``, ``reorder``)."""
        self.batch = other.batch
        self.non_tensor_batch = other.non_tensor_batch

    def select(
        self,
        batch_keys: Iterable[str] | None = None,
        non_tensor_batch_keys: Iterable[str] | None = None,
        meta_info_keys: Iterable[str] | None = None,
        deepcopy: bool = False,
    ) -> Self:
        """A DataProto with only the named columns/meta keys (tensors shared; ``deepcopy`` copies the rest)."""
        batch = self.batch
        if batch_keys is not None:
            if batch is None:
                raise DispatchKeyError(
                    f"cannot select batch keys {list(batch_keys)}: this DataProto has no tensor batch"
                )
            batch = batch.select(*batch_keys)
        elif batch is not None:
            batch = batch.copy()
        non_tensor = self.non_tensor_batch
        if non_tensor_batch_keys is not None:
            wanted = set(non_tensor_batch_keys)
            non_tensor = {k: v for k, v in non_tensor.items() if k in wanted}
        meta = self.meta_info
        if meta_info_keys is not None:
            wanted = set(meta_info_keys)
            meta = {k: v for k, v in meta.items() if k in wanted}
        if deepcopy:
            return self._new(batch, copy.deepcopy(non_tensor), copy.deepcopy(meta))
        return self._new(batch, dict(non_tensor), dict(meta))

    def pop(
        self,
        batch_keys: Iterable[str] | None = None,
        non_tensor_batch_keys: Iterable[str] | None = None,
        meta_info_keys: Iterable[str] | None = None,
    ) -> Self:
        """Remove the named columns/meta keys from self and return them as a DataProto."""
        batch_keys = list(batch_keys or ())
        nt_keys = list(non_tensor_batch_keys or ())
        meta_keys = list(meta_info_keys or ())
        for names, where, pool in (
            (batch_keys, "batch", self.batch.keys() if self.batch is not None else ()),
            (nt_keys, "non_tensor_batch", self.non_tensor_batch),
            (meta_keys, "meta_info", self.meta_info),
        ):
            missing = [k for k in names if k not in pool]
            if missing:
                raise DispatchKeyError(f"pop: {missing} not in {where} (has {sorted(pool)})")
        tensors = {k: self.batch.pop(k) for k in batch_keys}
        non_tensors = {k: self.non_tensor_batch.pop(k) for k in nt_keys}
        meta = {k: self.meta_info.pop(k) for k in meta_keys}
        batch = TensorBatch(tensors, batch_size=[len(self)]) if tensors else None
        return type(self)(batch=batch, non_tensor_batch=non_tensors, meta_info=meta)

    def rename(
        self,
        old_keys: str | list[str] | None = None,
        new_keys: str | list[str] | None = None,
    ) -> Self:
        """Rename batch keys in place; returns self."""
        old = [old_keys] if isinstance(old_keys, str) else old_keys
        new = [new_keys] if isinstance(new_keys, str) else new_keys
        if not isinstance(old, list) or not isinstance(new, list):
            raise DispatchTypeError(
                f"keys must be a str or list of str, got {type(old_keys).__name__} and {type(new_keys).__name__}"
            )
        if len(old) != len(new):
            raise DispatchValueError(f"new_keys and old_keys must have the same length, got {len(new)} and {len(old)}")
        if self.batch is None:
            raise DispatchKeyError(f"cannot rename {old}: this DataProto has no tensor batch")
        for o, n in zip(old, new, strict=True):
            self.batch.rename_key_(o, n)
        return self

    def union(self, other: DataProto) -> Self:
        """Merge ``other``'s columns and meta into self (shared keys must be equal); returns self.

        With a lazy ``other``, self becomes a ``LazyDataProto`` in place; nothing is fetched.
        """
        if not isinstance(other, DataProto):
            raise not_a_dataproto("DataProto.union", other)
        if other.is_lazy and not self.is_lazy:
            joined = type(other).of_local(self).union(other)  # type: ignore[attr-defined]
            self.__class__ = type(joined)  # in place, as verl code expects of union
            self.__dict__ = joined.__dict__
            return self
        if other.batch is not None:
            if self.batch is None:
                if self.non_tensor_batch and len(other) != len(self):
                    raise BatchSizeError(f"cannot union DataProtos of lengths {len(self)} and {len(other)}")
                self.batch = other.batch.copy()
            else:
                union_tensor_dict(self.batch, other.batch)
        elif other.non_tensor_batch and len(self) != len(other) and (self.batch is not None or self.non_tensor_batch):
            raise BatchSizeError(f"cannot union DataProtos of lengths {len(self)} and {len(other)}")
        union_numpy_dict(self.non_tensor_batch, other.non_tensor_batch)
        union_two_dict(self.meta_info, other.meta_info)
        self.check_consistency()
        return self

    def reorder(self, indices: torch.Tensor | np.ndarray | Sequence[int]) -> None:
        """Permute rows in place by ``indices``."""
        self._assume_rows(self.select_idxs(indices))

    def repeat(self, repeat_times: int = 2, interleave: bool = True) -> Self:
        """Each row ``repeat_times`` times: ``aabb`` (interleave) or ``abab``."""
        return repeat_rows(self, repeat_times, interleave)

    def sample_level_repeat(self, repeat_times: Sequence[int] | np.ndarray | torch.Tensor) -> Self:
        """Row i repeated ``repeat_times[i]`` times (interleaved)."""
        return repeat_rows_per_sample(self, repeat_times)

    def unfold_column_chunks(self, n_split: int, split_keys: list[str] | None = None) -> Self:
        """Split dim 1 of ``split_keys`` into ``n_split`` rows each; other columns repeat."""
        return unfold_column_chunks(self, n_split, split_keys)

    def to(self, device: torch.device | str, **kwargs: Any) -> Self:
        """Move the tensors to ``device`` in place; returns self (as verl)."""
        if self.batch is not None:
            self.batch = self.batch.to(device, **kwargs)
        return self

    def make_iterator(
        self,
        mini_batch_size: int,
        epochs: int,
        seed: int | None = None,
        dataloader_kwargs: dict[str, Any] | None = None,
    ) -> Iterator[Self]:
        """Yield mini-batches of ``mini_batch_size`` rows for ``epochs`` epochs (a DataLoader's, seeded by ``seed``)."""
        return iterate_minibatches(self, mini_batch_size, epochs, seed, dataloader_kwargs)

    def to_tensordict(self) -> Any:
        """A TensorDict of the tensors, non-tensor columns and meta info (needs tensordict)."""
        return to_tensordict(self)

    def save_to_disk(self, filepath: str | os.PathLike[str]) -> None:
        """Pickle self to ``filepath``."""
        with open(filepath, "wb") as f:
            pickle.dump(self, f, protocol=pickle.HIGHEST_PROTOCOL)

    @staticmethod
    def load_from_disk(filepath: str | os.PathLike[str]) -> DataProto:
        """Read a DataProto written by :meth:`save_to_disk`."""
        with open(filepath, "rb") as f:
            return cast(DataProto, pickle.load(f))

    def __getstate__(self) -> dict[str, Any]:
        """Tensors as their own bytes (numpy arrays, out of band under protocol 5), only this view's rows."""
        return self._pickle_state(protocol5=False)

    def __reduce_ex__(self, protocol: SupportsIndex) -> Any:
        """Under protocol 5 tensors go as bare out-of-band buffers (a third shorter than numpy arrays)."""
        if int(protocol) < 5 or type(self).__reduce__ is not object.__reduce__:
            return super().__reduce_ex__(protocol)
        return copyreg.__newobj__, (type(self),), self._pickle_state(protocol5=True)  # type: ignore[attr-defined]  # missing from the stubs

    def _pickle_state(self, *, protocol5: bool) -> dict[str, Any]:
        return {
            "batch": None if self.batch is None else batch_state(self.batch, protocol5=protocol5),
            "non_tensor_batch": self.non_tensor_batch,
            "meta_info": self.meta_info,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._batch = None if state["batch"] is None else batch_from_state(state["batch"])
        self.non_tensor_batch = state["non_tensor_batch"]
        self.meta_info = state["meta_info"]


def collate_fn(x: list[DataProtoItem]) -> DataProto:
    """Stack row items back into a DataProto (verl's ``collate_fn`` for a DataLoader)."""
    return collate_rows(x, DataProto)
