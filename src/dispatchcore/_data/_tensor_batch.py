"""``TensorBatch``: the tensor part of a :class:`~dispatchcore.DataProto`, TensorDict's API without tensordict.

The subset of TensorDict verl code uses, with its meanings (``len`` is rows, row slices are views).
"""

from __future__ import annotations

import itertools
from collections.abc import (
    Callable,
    ItemsView,
    Iterable,
    Iterator,
    KeysView,
    Mapping,
    ValuesView,
)
from typing import Any

import numpy as np
import torch

from dispatchcore._base._errors import (
    BatchSizeError,
    DispatchIndexError,
    DispatchKeyError,
    DispatchTypeError,
    DispatchValueError,
)
from dispatchcore._wire._tensor_pickle import rebuild_tensor, reduce_tensor

from .._wire import RowBuffers, cat_rows

__all__ = ["TensorBatch", "is_tensordict", "made_batch"]

_MISSING: Any = object()


def is_tensordict(obj: Any) -> bool:
    """True for tensordict's containers, recognised without importing tensordict."""
    module = type(obj).__module__ or ""
    return module.split(".")[0] == "tensordict" and hasattr(obj, "batch_size")


def _as_tensor(key: str, value: Any) -> torch.Tensor:
    """Accept tensors and numeric numpy arrays (as TensorDict does)."""
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, np.ndarray) and value.dtype != object:
        return torch.from_numpy(value)
    raise DispatchTypeError(
        f"TensorBatch values must be torch.Tensor, got {type(value).__name__} for key {key!r}; "
        "put non-tensor columns in DataProto.non_tensor_batch"
    )


def _check_row_index(index: Any) -> Any:
    """Validate a row index and turn numpy arrays into tensors for torch."""
    if isinstance(index, bool | np.bool_):
        raise DispatchTypeError(f"cannot index rows with a bool ({index!r}); use a bool mask array")
    if isinstance(index, int | np.integer):
        return int(index)
    if isinstance(index, slice) or index is Ellipsis:
        return index
    if isinstance(index, np.ndarray):
        if index.dtype != bool and not np.issubdtype(index.dtype, np.integer):
            raise DispatchTypeError(f"row index array must hold ints or bools, got dtype {index.dtype}")
        return torch.from_numpy(np.ascontiguousarray(index))
    if isinstance(index, torch.Tensor):
        if index.dtype != torch.bool and index.is_floating_point():
            raise DispatchTypeError(f"row index tensor must hold ints or bools, got dtype {index.dtype}")
        return index
    if isinstance(index, list):
        if not index:
            return torch.zeros(0, dtype=torch.long)
        return _check_row_index(np.asarray(index))
    raise DispatchTypeError(f"cannot index a TensorBatch with {type(index).__name__}")


class TensorBatch:
    """Name -> tensor mapping sharing leading dims ``batch_size``: ``TensorBatch({"x": t}, batch_size=[n])``."""

    __slots__ = ("_batch_size", "_tensors")

    def __init__(
        self,
        source: Mapping[str, Any] | None = None,
        batch_size: Iterable[int] | int | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        if is_tensordict(source):
            if batch_size is None:
                batch_size = source.batch_size  # type: ignore[union-attr]
            source = _tensordict_items(source)
        tensors = {str(k): _as_tensor(str(k), v) for k, v in (source or {}).items()}
        if device is not None:
            tensors = {k: v.to(device) for k, v in tensors.items()}
        if batch_size is None:
            first = next(iter(tensors.values()), None)
            size = torch.Size([] if first is None or first.dim() == 0 else [first.shape[0]])
        elif isinstance(batch_size, int):
            size = torch.Size([batch_size])
        else:
            size = torch.Size(batch_size)
        self._batch_size = size
        self._tensors: dict[str, torch.Tensor] = {}
        for key, tensor in tensors.items():
            self._check_shape(key, tensor)
            self._tensors[key] = tensor

    def _check_shape(self, key: str, tensor: torch.Tensor) -> None:
        dims = len(self._batch_size)
        if tuple(tensor.shape[:dims]) != tuple(self._batch_size):
            raise BatchSizeError(
                f"tensor {key!r} has shape {tuple(tensor.shape)}, which does not start with "
                f"the batch size {tuple(self._batch_size)}"
            )

    @property
    def batch_size(self) -> torch.Size:
        """Leading dims every tensor shares (``torch.Size([n])`` for a batch)."""
        return self._batch_size

    @property
    def shape(self) -> torch.Size:
        """Alias of :attr:`batch_size`, as on TensorDict."""
        return self._batch_size

    @property
    def batch_dims(self) -> int:
        """Number of leading dims that are batch dims."""
        return len(self._batch_size)

    @property
    def device(self) -> torch.device | None:
        """The tensors' common device, or None when empty or mixed."""
        devices = {t.device for t in self._tensors.values()}
        return devices.pop() if len(devices) == 1 else None

    def __len__(self) -> int:
        return int(self._batch_size[0]) if self._batch_size else 0

    def numel(self) -> int:
        """Number of rows over all batch dims."""
        return int(self._batch_size.numel())

    def is_empty(self) -> bool:
        """True when there are no tensors (whatever the batch size)."""
        return not self._tensors

    def keys(self) -> KeysView[str]:
        """The tensor names (a live, read-only view)."""
        return self._tensors.keys()

    def values(self) -> ValuesView[torch.Tensor]:
        """The tensors."""
        return self._tensors.values()

    def items(self) -> ItemsView[str, torch.Tensor]:
        """``(name, tensor)`` pairs."""
        return self._tensors.items()

    def __iter__(self) -> Iterator[str]:
        return iter(self._tensors)

    def __contains__(self, key: object) -> bool:
        return key in self._tensors

    def get(self, key: str, default: Any = None) -> Any:
        """The tensor named ``key``, or ``default``."""
        return self._tensors.get(key, default)

    def set(self, key: str, value: torch.Tensor) -> TensorBatch:
        """Set a tensor (checked against the batch size); returns self."""
        self[key] = value
        return self

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, str):
            try:
                return self._tensors[index]
            except KeyError:
                raise DispatchKeyError(f"key {index!r} not in TensorBatch (keys: {sorted(self._tensors)})") from None
        if isinstance(index, tuple) and index and all(isinstance(i, str) for i in index):
            raise DispatchKeyError(f"nested keys are not supported: {index!r}")
        return self._index_rows(index)

    def __setitem__(self, index: Any, value: Any) -> None:
        if isinstance(index, str):
            tensor = _as_tensor(index, value)
            self._check_shape(index, tensor)
            self._tensors[index] = tensor
            return
        # Row assignment: ``batch[idx] = other`` writes every key's rows.
        index = _check_row_index(index)
        for key, tensor in self._tensors.items():
            tensor[index] = value[key]

    def __delitem__(self, key: str) -> None:
        del self._tensors[key]

    def pop(self, key: str, default: Any = _MISSING) -> Any:
        """Remove and return the tensor ``key`` (``default`` if given and absent)."""
        if default is _MISSING:
            if key not in self._tensors:
                raise DispatchKeyError(f"key {key!r} not in TensorBatch (keys: {sorted(self._tensors)})")
            return self._tensors.pop(key)
        return self._tensors.pop(key, default)

    def update(self, other: Mapping[str, Any] | TensorBatch, **kwargs: Any) -> TensorBatch:
        """Set every tensor of ``other`` (checked); returns self like TensorDict."""
        if is_tensordict(other):
            other = _tensordict_items(other)
        for key, value in {**dict(other.items()), **kwargs}.items():
            self[key] = value
        return self

    def rename_key_(self, old_key: str, new_key: str, safe: bool = False) -> TensorBatch:
        """Rename a key in place (keeping its position); returns self."""
        if old_key not in self._tensors:
            raise DispatchKeyError(f"key {old_key!r} not in TensorBatch (keys: {sorted(self._tensors)})")
        if safe and new_key in self._tensors and new_key != old_key:
            raise DispatchKeyError(f"key {new_key!r} already in TensorBatch")
        self._tensors = {(new_key if k == old_key else k): v for k, v in self._tensors.items()}
        return self

    def to_dict(self) -> dict[str, torch.Tensor]:
        """A plain dict of the tensors (the tensors are shared)."""
        return dict(self._tensors)

    def _index_rows(self, index: Any) -> TensorBatch:
        if type(index) is slice and len(self._batch_size) == 1:  # fast path (every chunk): a view per tensor
            rows = torch.Size([len(range(*index.indices(self._batch_size[0])))])
            return made_batch(rows, {k: v[index] for k, v in self._tensors.items()})
        index = _check_row_index(index)
        if not self._batch_size:
            raise DispatchIndexError("cannot index rows of a TensorBatch with no batch dims")
        # Shape of the result's batch dims, computed on a stride-0 stand-in.
        probe = torch.zeros((), dtype=torch.uint8).expand(self._batch_size)
        return made_batch(probe[index].shape, {k: v[index] for k, v in self._tensors.items()})

    def _with(self, tensors: dict[str, torch.Tensor]) -> TensorBatch:
        return made_batch(self._batch_size, tensors)

    def chunk(self, chunks: int, dim: int = 0) -> tuple[TensorBatch, ...]:
        """Views of ``chunks`` row ranges (sizes as ``torch.chunk``)."""
        _dim0(dim)
        if chunks <= 0:
            raise DispatchValueError(f"chunks must be positive, got {chunks}")
        n = len(self)
        step = -(-n // chunks) if n else 0
        if step == 0:
            return (self[0:0],)
        return tuple(self[i : i + step] for i in range(0, n, step))

    def split(self, split_size: int | list[int], dim: int = 0) -> tuple[TensorBatch, ...]:
        """Views of consecutive row ranges of ``split_size`` rows (as ``torch.split``)."""
        _dim0(dim)
        n = len(self)
        if isinstance(split_size, int):
            if split_size <= 0:
                raise DispatchValueError(f"split_size must be positive, got {split_size}")
            bounds = list(range(0, n, split_size)) or [0]
            return tuple(self[b : b + split_size] for b in bounds)
        if sum(split_size) != n:
            raise BatchSizeError(f"split sizes {split_size} do not sum to the batch length {n}")
        bounds = [0, *itertools.accumulate(split_size)]
        return tuple(self[start:stop] for start, stop in itertools.pairwise(bounds))

    def unbind(self, dim: int = 0) -> tuple[TensorBatch, ...]:
        """One row item per row."""
        _dim0(dim)
        return tuple(self[i] for i in range(len(self)))

    def select(self, *keys: str, strict: bool = True) -> TensorBatch:
        """A new batch holding only ``keys`` (tensors shared)."""
        if strict:
            missing = [k for k in keys if k not in self._tensors]
            if missing:
                raise DispatchKeyError(f"keys {missing} not in TensorBatch (keys: {sorted(self._tensors)})")
        return self._with({k: self._tensors[k] for k in keys if k in self._tensors})

    def exclude(self, *keys: str) -> TensorBatch:
        """A new batch without ``keys`` (tensors shared)."""
        drop = set(keys)
        return self._with({k: v for k, v in self._tensors.items() if k not in drop})

    def apply(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> TensorBatch:
        """A new batch of ``fn(tensor)`` for every tensor, same batch size."""
        out = self._with({})
        for key, value in self._tensors.items():
            out[key] = fn(value)
        return out

    def to(self, *args: Any, **kwargs: Any) -> TensorBatch:
        """A new batch with every tensor moved/cast by ``Tensor.to(*args, **kwargs)``."""
        return self._with({k: v.to(*args, **kwargs) for k, v in self._tensors.items()})

    def cpu(self) -> TensorBatch:
        """A new batch on the CPU."""
        return self.to("cpu")

    def clone(self, recurse: bool = True) -> TensorBatch:
        """A copy; ``recurse=False`` copies only the container."""
        if not recurse:
            return self._with(dict(self._tensors))
        return self._with({k: v.clone() for k, v in self._tensors.items()})

    def copy(self) -> TensorBatch:
        """A shallow copy (new container, same tensors), as TensorDict.copy()."""
        return self.clone(recurse=False)

    def contiguous(self) -> TensorBatch:
        """A batch whose tensors are all contiguous (copies only where needed)."""
        return self._with({k: v.contiguous() for k, v in self._tensors.items()})

    @classmethod
    def cat(cls, batches: Iterable[TensorBatch], dim: int = 0, *, row_buffers: RowBuffers | None = None) -> TensorBatch:
        """Concatenate rows: one ``torch.cat`` per key."""
        _dim0(dim)
        items = list(batches)
        if not items:
            raise BatchSizeError("TensorBatch.cat got an empty list; nothing to concatenate")
        first_keys = items[0]._tensors.keys()
        keys = list(first_keys)
        for pos, item in enumerate(items[1:], start=1):
            if item._tensors.keys() != first_keys:  # keys views compare as sets, without copying
                raise DispatchValueError(
                    f"cannot concatenate batches with different keys: item 0 has {sorted(keys)}, "
                    f"item {pos} has {sorted(item.keys())}"
                )
        first_size = items[0]._batch_size
        rows = sum([b._batch_size[0] if b._batch_size else 0 for b in items])
        size = torch.Size([rows, *first_size[1:]] if len(first_size) > 1 else [rows])
        return made_batch(size, {k: cat_rows([b._tensors[k] for b in items], row_buffers) for k in keys})

    @classmethod
    def stack(cls, batches: Iterable[TensorBatch], dim: int = 0) -> TensorBatch:
        """Stack row items (or batches) along a new leading dim."""
        _dim0(dim)
        items = list(batches)
        if not items:
            raise BatchSizeError("TensorBatch.stack got an empty list; nothing to stack")
        size = torch.Size([len(items), *items[0].batch_size])
        return made_batch(size, {k: torch.stack([b[k] for b in items], dim=0) for k in items[0].keys()})

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        """Let ``torch.cat`` / ``torch.stack`` take TensorBatches, as with TensorDict."""
        kwargs = kwargs or {}
        if func is torch.cat:
            return cls.cat(*args, **kwargs)
        if func is torch.stack:
            return cls.stack(*args, **kwargs)
        return NotImplemented

    def __getstate__(self) -> dict[str, Any]:
        return batch_state(self)

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._batch_size = torch.Size(state["batch_size"])
        self._tensors = {k: _rebuild(args) for k, args in state["tensors"].items()}

    def __repr__(self) -> str:
        fields = ", ".join(
            f"{k}: {tuple(v.shape)} {str(v.dtype).replace('torch.', '')}" for k, v in self._tensors.items()
        )
        return f"TensorBatch({{{fields}}}, batch_size={list(self._batch_size)})"


def batch_state(batch: TensorBatch, *, protocol5: bool = False) -> dict[str, Any]:
    """Picklable state: each tensor as its own bytes (``protocol5``: bare pickle buffers, else numpy arrays)."""
    return {
        "batch_size": tuple(batch.batch_size),
        "tensors": {k: _tensor_args(v, protocol5) for k, v in batch.items()},
    }


def batch_from_state(state: dict[str, Any]) -> TensorBatch:
    """Inverse of :func:`batch_state`."""
    out = TensorBatch.__new__(TensorBatch)
    out.__setstate__(state)
    return out


def made_batch(batch_size: torch.Size, tensors: dict[str, torch.Tensor]) -> TensorBatch:
    """A TensorBatch of tensors already checked against ``batch_size``."""
    out = TensorBatch.__new__(TensorBatch)
    out._batch_size = batch_size
    out._tensors = tensors
    return out


def _tensor_args(t: torch.Tensor, protocol5: bool = False) -> tuple[Any, ...]:
    """``reduce_tensor``'s arguments; empty tensors carry no bytes (their byte views may have stride 0)."""
    if t.numel() == 0:
        device = None if t.device.type == "cpu" else str(t.device)
        return (None, t.dtype, tuple(t.shape), device, False)
    return reduce_tensor(t, protocol5=protocol5)[1]


def _rebuild(args: tuple[Any, ...]) -> torch.Tensor:
    raw, dtype, shape, device = args[:4]
    if raw is not None:
        return rebuild_tensor(*args)
    if device is None:
        return torch.empty(shape, dtype=dtype)
    return rebuild_tensor(np.zeros(0, dtype=np.uint8), torch.uint8, (0,), device).new_empty(shape, dtype=dtype)


def _dim0(dim: int) -> None:
    if dim != 0:
        raise DispatchValueError(f"TensorBatch only splits and joins along dim 0, got dim={dim}")


def _tensordict_items(td: Any) -> dict[str, torch.Tensor]:
    """Plain tensors of a TensorDict; nested or non-tensor entries are refused."""
    out: dict[str, torch.Tensor] = {}
    for key, value in td.items():
        if not isinstance(value, torch.Tensor):
            raise DispatchTypeError(
                f"TensorDict entry {key!r} is a {type(value).__name__}; only plain tensors "
                "can go in DataProto.batch (use DataProto.from_tensordict for non-tensor data)"
            )
        out[str(key)] = value
    return out
