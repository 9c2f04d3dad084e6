"""``data.batch`` and ``data.non_tensor_batch`` of a lazy DataProto: names known, columns fetched when read."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, MutableMapping
from typing import Any, Protocol

import torch

from .._base import DispatchKeyError, DispatchTypeError
from .._data import TensorBatch
from ._records import ColumnSpec


class ColumnOwner(Protocol):
    """What the column views need of their lazy DataProto (which builds them, so they cannot name it)."""

    _specs: dict[str, ColumnSpec]

    def __len__(self) -> int: ...
    def tensor_keys(self) -> list[str]: ...
    def array_keys(self) -> list[str]: ...
    def read(self, names: Iterable[str], timeout: float | None = None) -> dict[str, Any]: ...
    def set_column(self, name: str, value: Any) -> None: ...
    def drop_column(self, name: str) -> None: ...
    def rename(self, old_keys: str | list[str] | None = None, new_keys: str | list[str] | None = None) -> Any: ...


class LazyTensorColumns:
    """``data.batch`` of a lazy DataProto; beyond verl's TensorBatch surface it works on a fetched copy."""

    def __init__(self, owner: ColumnOwner) -> None:
        self._owner = owner

    def keys(self) -> list[str]:
        return self._owner.tensor_keys()

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())

    def __contains__(self, key: object) -> bool:
        return key in self.keys()

    def __len__(self) -> int:
        return len(self._owner)

    @property
    def batch_size(self) -> torch.Size:
        return torch.Size([len(self._owner)])

    @property
    def shape(self) -> torch.Size:
        return self.batch_size

    @property
    def device(self) -> torch.device | None:
        devices = {self._owner._specs[n].device for n in self.keys()}
        return torch.device(devices.pop()) if len(devices) == 1 else None

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, str):
            if key not in self.keys():
                raise DispatchKeyError(f"{key!r} is not a tensor column (has {sorted(self.keys())})")
            return self._owner.read([key])[key]
        return self._fetched()[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self[key] if key in self.keys() else default

    def __setitem__(self, key: str, value: torch.Tensor) -> None:
        if not isinstance(key, str):
            raise DispatchTypeError("a lazy DataProto's batch takes column writes only (batch['name'] = tensor)")
        self._owner.set_column(key, torch.as_tensor(value))

    def set(self, key: str, value: torch.Tensor) -> LazyTensorColumns:
        self[key] = value
        return self

    def __delitem__(self, key: str) -> None:
        self._owner.drop_column(key)

    def pop(self, key: str, *default: Any) -> Any:
        if key not in self.keys():
            if default:
                return default[0]
            raise DispatchKeyError(key)
        value = self[key]
        self._owner.drop_column(key)
        return value

    def update(self, other: Mapping[str, Any] | TensorBatch, **kwargs: Any) -> LazyTensorColumns:
        for key, value in {**dict(other.items()), **kwargs}.items():
            self[key] = value
        return self

    def items(self) -> list[tuple[str, torch.Tensor]]:
        columns = self._owner.read(self.keys())
        return [(k, columns[k]) for k in self.keys()]

    def values(self) -> list[torch.Tensor]:
        return [v for _, v in self.items()]

    def select(self, *keys: str, strict: bool = True) -> TensorBatch:
        columns = self._owner.read([k for k in keys if strict or k in self.keys()])
        return TensorBatch(columns, batch_size=[len(self._owner)])

    def rename_key_(self, old_key: str, new_key: str, safe: bool = False) -> LazyTensorColumns:
        self._owner.rename(old_key, new_key)
        return self

    def _fetched(self) -> TensorBatch:
        return TensorBatch(dict(self.items()), batch_size=[len(self._owner)])

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._fetched(), name)

    def __repr__(self) -> str:
        return f"LazyTensorColumns(rows={len(self._owner)}, keys={self.keys()})"


class LazyArrayColumns(MutableMapping[str, Any]):
    """``data.non_tensor_batch`` of a lazy DataProto: a mapping whose arrays are fetched when read."""

    def __init__(self, owner: ColumnOwner) -> None:
        self._owner = owner

    def __getitem__(self, key: str) -> Any:
        if key not in self._owner.array_keys():
            raise DispatchKeyError(key)
        return self._owner.read([key])[key]

    def __setitem__(self, key: str, value: Any) -> None:
        self._owner.set_column(key, value)

    def __delitem__(self, key: str) -> None:
        if key not in self._owner.array_keys():
            raise DispatchKeyError(key)
        self._owner.drop_column(key)

    def __iter__(self) -> Iterator[str]:
        return iter(self._owner.array_keys())

    def __len__(self) -> int:
        return len(self._owner.array_keys())

    def copy(self) -> dict[str, Any]:
        return dict(self._owner.read(self._owner.array_keys()))

    def __repr__(self) -> str:
        return f"LazyArrayColumns(keys={self._owner.array_keys()})"
