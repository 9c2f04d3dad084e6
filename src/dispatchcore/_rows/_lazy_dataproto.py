"""A ``DataProto`` whose rows stay on the ranks that made them (issue 15).

Plan-only operations move no rows; the rest reads every column first (``docs/lazy-results.md``).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Self

import numpy as np
import torch

from .._base import BatchSizeError, DispatchIndexError, DispatchKeyError, DispatchValueError
from .._data import DataProto, TensorBatch, as_index, merge_meta_info, union_two_dict
from .._trace import count_received
from ._column_plan import ColumnPlan, Segment
from ._fetch import assemble_column, fetch_on_driver, plan_requests
from ._lazy_columns import LazyArrayColumns, LazyTensorColumns
from ._records import ColumnSpec
from ._remote import RemoteRows


class LazyDataProto(DataProto):
    """Columns planned from rows held on ranks (and on the driver); fetched on first touch."""

    #: Lets ``DataProto.concat`` tell lazy items apart without importing this module.
    is_lazy = True

    def __init__(
        self,
        plans: Mapping[str, ColumnPlan],
        specs: Mapping[str, ColumnSpec],
        length: int,
        meta_info: Mapping[str, Any] | None = None,
        has_batch: bool = True,
    ) -> None:
        self._plans = dict(plans)
        self._specs = dict(specs)
        self._length = length
        self._has_batch = has_batch or any(s.tensor for s in self._specs.values())
        self.meta_info = dict(meta_info or {})

    @classmethod
    def of_remote(cls, rows: RemoteRows) -> LazyDataProto:
        """All of one rank's kept result."""
        held = rows.held
        whole = ColumnPlan((Segment(rows, slice(0, held.rows)),))
        return cls(dict.fromkeys(held.columns, whole), held.columns, held.rows, held.meta_info, held.has_batch)

    @classmethod
    def of_local(cls, data: DataProto) -> LazyDataProto:
        """A driver-side DataProto in lazy form (to join it with lazy ones)."""
        if isinstance(data, LazyDataProto):
            return data
        plans: dict[str, ColumnPlan] = {}
        specs: dict[str, ColumnSpec] = {}
        if data.batch is not None:
            for name, tensor in data.batch.items():
                plans[name], specs[name] = ColumnPlan.local(tensor), ColumnSpec.of(tensor)
        for name, array in data.non_tensor_batch.items():
            plans[name], specs[name] = ColumnPlan.local(array), ColumnSpec.of(array)
        return cls(plans, specs, len(data), data.meta_info, data.batch is not None)

    def _sibling(self, plans: Mapping[str, ColumnPlan], length: int, meta: Mapping[str, Any]) -> LazyDataProto:
        specs = {name: self._specs[name] for name in plans}
        return LazyDataProto(plans, specs, length, meta, self._has_batch)

    def __len__(self) -> int:
        return self._length

    def tensor_keys(self) -> list[str]:
        return [n for n in self._plans if self._specs[n].tensor]

    def array_keys(self) -> list[str]:
        return [n for n in self._plans if not self._specs[n].tensor]

    @property
    def column_specs(self) -> dict[str, ColumnSpec]:
        """Each column's dtype, per-row shape and device (tensor columns) without fetching."""
        return dict(self._specs)

    def remote_sources(self) -> list[RemoteRows]:
        """The rank results this object reads rows from (each once)."""
        seen: dict[int, RemoteRows] = {}
        for plan in self._plans.values():
            for segment in plan.segments:
                if isinstance(segment.source, RemoteRows):
                    seen.setdefault(id(segment.source), segment.source)
        return list(seen.values())

    def bring_unreachable_rows(self, executor: Any) -> None:
        """Read, once for the whole batch, the columns whose rows ``executor``'s ranks cannot reach."""
        reaches = executor.can_fetch_rows if executor is not None else (lambda address: False)
        unreachable = {id(s) for s in self.remote_sources() if not reaches(s.address)}
        if not unreachable:
            return
        names = [
            name
            for name, plan in self._plans.items()
            if any(isinstance(seg.source, RemoteRows) and id(seg.source) in unreachable for seg in plan.segments)
        ]
        self.read(names)

    def check_consistency(self) -> None:
        """Column plans cover the same rows by construction; driver-side writes are checked when made."""

    def __repr__(self) -> str:
        remote = len(self.remote_sources())
        return f"LazyDataProto(rows={self._length}, columns={list(self._plans)}, remote_sources={remote})"

    @property  # type: ignore[override]
    def batch(self) -> LazyTensorColumns:
        return LazyTensorColumns(self) if self._has_batch else None  # type: ignore[return-value]

    @batch.setter
    def batch(self, value: Any) -> None:
        for name in self.tensor_keys():
            del self._plans[name], self._specs[name]
        self._has_batch = value is not None
        if value is not None:
            for name, tensor in value.items():
                self.set_column(name, tensor)

    @property  # type: ignore[override]
    def non_tensor_batch(self) -> LazyArrayColumns:
        return LazyArrayColumns(self)

    @non_tensor_batch.setter
    def non_tensor_batch(self, value: Mapping[str, Any]) -> None:
        for name in self.array_keys():
            del self._plans[name], self._specs[name]
        for name, array in value.items():
            self.set_column(name, array)

    def set_column(self, name: str, value: Any) -> None:
        """Add or replace column ``name`` with a driver-side tensor or numpy array of ``len(self)`` rows."""
        if not isinstance(value, torch.Tensor):
            value = np.asarray(value)
        if len(value) != self._length:
            raise BatchSizeError(f"column {name!r} has {len(value)} rows; this DataProto has {self._length}")
        self._plans[name], self._specs[name] = ColumnPlan.local(value), ColumnSpec.of(value)
        if isinstance(value, torch.Tensor):
            self._has_batch = True

    def drop_column(self, name: str) -> None:
        if name not in self._plans:
            raise DispatchKeyError(f"{name!r} is not a column of this DataProto (has {sorted(self._plans)})")
        del self._plans[name], self._specs[name]

    def read(self, names: Iterable[str], timeout: float | None = None) -> dict[str, Any]:
        """Columns ``names`` on the driver (fetched once, one request per source; then kept here)."""
        names = list(names)
        missing = [n for n in names if n not in self._plans]
        if missing:
            raise DispatchKeyError(f"{missing} not among this DataProto's columns {sorted(self._plans)}")
        wanted = {n: self._plans[n] for n in names}
        requests, slots = plan_requests(wanted)
        fetched = fetch_on_driver(requests, timeout)
        count_received(fetched)
        out: dict[str, Any] = {}
        for name, plan in wanted.items():
            column = assemble_column(plan, self._specs[name], self._length, name, slots, fetched)
            self._plans[name] = ColumnPlan.local(column)
            out[name] = column
        return out

    def materialize(self, timeout: float | None = None) -> DataProto:
        """A plain ``DataProto`` of every row and column (fetched now)."""
        columns = self.read(list(self._plans), timeout)
        tensors = {n: columns[n] for n in self.tensor_keys()}
        arrays = {n: columns[n] for n in self.array_keys()}
        batch = TensorBatch(tensors, batch_size=[self._length]) if self._has_batch else None
        return DataProto(batch=batch, non_tensor_batch=arrays, meta_info=copy.copy(self.meta_info))

    def _rows(self, rows: slice | np.ndarray, length: int) -> LazyDataProto:
        return self._sibling({n: p.take(rows) for n, p in self._plans.items()}, length, dict(self.meta_info))

    def slice(self, start: int | None = None, end: int | None = None, step: int | None = None) -> LazyDataProto:
        rng = range(self._length)[slice(start, end, step)]
        rows = slice(rng.start, rng.stop) if rng.step == 1 else np.asarray(rng, dtype=np.int64)
        return self._rows(rows, len(rng))

    def _take(self, index: np.ndarray) -> LazyDataProto:
        return self._rows(np.asarray(index, dtype=np.int64), len(index))

    def select_idxs(self, idxs: Sequence[int] | np.ndarray | torch.Tensor) -> LazyDataProto:
        _, index = as_index(idxs, self._length)
        if index.dtype == bool:
            index = np.flatnonzero(index)
        index = np.where(index < 0, index + self._length, index).astype(np.int64)
        return self._take(index)

    def __getitem__(self, item: Any) -> Any:
        if isinstance(item, int | np.integer) and not isinstance(item, bool):
            if not -self._length <= item < self._length:
                raise DispatchIndexError(f"row {item} is out of range for a DataProto of length {self._length}")
            return self._take(np.array([int(item) % self._length])).materialize()[0]
        return super().__getitem__(item)

    def _assume_rows(self, other: Self) -> None:
        self._plans, self._length = other._plans, other._length

    def select(
        self,
        batch_keys: Iterable[str] | None = None,
        non_tensor_batch_keys: Iterable[str] | None = None,
        meta_info_keys: Iterable[str] | None = None,
        deepcopy: bool = False,
    ) -> LazyDataProto:
        keep = set(self._plans)
        if batch_keys is not None:
            batch_keys = list(batch_keys)
            missing = [k for k in batch_keys if k not in self.tensor_keys()]
            if missing:
                raise DispatchKeyError(f"select: {missing} not in batch (has {sorted(self.tensor_keys())})")
            keep -= set(self.tensor_keys()) - set(batch_keys)
        if non_tensor_batch_keys is not None:
            keep -= set(self.array_keys()) - set(non_tensor_batch_keys)
        meta = self.meta_info
        if meta_info_keys is not None:
            wanted = set(meta_info_keys)
            meta = {k: v for k, v in meta.items() if k in wanted}
        meta = copy.deepcopy(meta) if deepcopy else dict(meta)
        return self._sibling({n: p for n, p in self._plans.items() if n in keep}, self._length, meta)

    def pop(
        self,
        batch_keys: Iterable[str] | None = None,
        non_tensor_batch_keys: Iterable[str] | None = None,
        meta_info_keys: Iterable[str] | None = None,
    ) -> LazyDataProto:
        batch_keys = list(batch_keys or ())
        nt_keys = list(non_tensor_batch_keys or ())
        meta_keys = list(meta_info_keys or ())
        for names, where, pool in (
            (batch_keys, "batch", self.tensor_keys()),
            (nt_keys, "non_tensor_batch", self.array_keys()),
            (meta_keys, "meta_info", list(self.meta_info)),
        ):
            missing = [k for k in names if k not in pool]
            if missing:
                raise DispatchKeyError(f"pop: {missing} not in {where} (has {sorted(pool)})")
        popped = {n: self._plans.pop(n) for n in [*batch_keys, *nt_keys]}
        specs = {n: self._specs.pop(n) for n in popped}
        meta = {k: self.meta_info.pop(k) for k in meta_keys}
        return LazyDataProto(popped, specs, self._length, meta, bool(batch_keys))

    def rename(self, old_keys: str | list[str] | None = None, new_keys: str | list[str] | None = None) -> LazyDataProto:
        old = [old_keys] if isinstance(old_keys, str) else list(old_keys or [])
        new = [new_keys] if isinstance(new_keys, str) else list(new_keys or [])
        if len(old) != len(new):
            raise DispatchValueError(f"new_keys and old_keys must have the same length, got {len(new)} and {len(old)}")
        for o, n in zip(old, new, strict=True):
            if o not in self.tensor_keys():
                raise DispatchKeyError(f"cannot rename {o!r}: not in batch (has {sorted(self.tensor_keys())})")
            self._plans[n], self._specs[n] = self._plans.pop(o), self._specs.pop(o)
        return self

    def union(self, other: DataProto) -> LazyDataProto:
        """Add ``other``'s columns (lazy or local) and meta; a shared column must be the same plan or equal."""
        theirs = LazyDataProto.of_local(other)
        if theirs._plans and self._plans and len(theirs) != self._length:
            raise BatchSizeError(f"cannot union DataProtos of lengths {self._length} and {len(theirs)}")
        shared = [n for n in theirs._plans if n in self._plans and theirs._plans[n] is not self._plans[n]]
        if shared:
            mine, other_cols = self.read(shared), theirs.read(shared)
            for name in shared:
                a, b = mine[name], other_cols[name]
                same = torch.equal(a, b) if isinstance(a, torch.Tensor) else np.array_equal(a, b)
                if not same:
                    raise DispatchValueError(f"union: column {name!r} differs between the two DataProtos")
        if not self._plans:
            self._length = len(theirs)
        for name, plan in theirs._plans.items():
            self._plans.setdefault(name, plan)
            self._specs.setdefault(name, theirs._specs[name])
        self._has_batch = self._has_batch or theirs._has_batch
        union_two_dict(self.meta_info, theirs.meta_info)
        return self

    @staticmethod
    def concat_lazy(items: Sequence[DataProto]) -> LazyDataProto:
        """``DataProto.concat`` when any item is lazy: plans joined, rows untouched."""
        parts = [LazyDataProto.of_local(item) for item in items]
        names = list(parts[0]._plans)
        for pos, part in enumerate(parts[1:], start=1):
            if set(part._plans) != set(names):
                raise DispatchValueError(
                    f"DataProto.concat: column names differ: item 0 has {sorted(names)}, item {pos} has "
                    f"{sorted(part._plans)}"
                )
        plans = {n: ColumnPlan.concat([p._plans[n] for p in parts]) for n in names}
        meta = merge_meta_info([p.meta_info for p in parts])
        length = sum(len(p) for p in parts)
        return LazyDataProto(plans, parts[0]._specs, length, meta, parts[0]._has_batch)

    def __reduce__(self) -> Any:
        return (_plain, (self.materialize(),))

    def __getstate__(self) -> dict[str, Any]:
        return self.materialize().__getstate__()

    def repeat(self, repeat_times: int = 2, interleave: bool = True) -> LazyDataProto:
        return LazyDataProto.of_local(self.materialize().repeat(repeat_times, interleave))

    def sample_level_repeat(self, repeat_times: Any) -> LazyDataProto:
        return LazyDataProto.of_local(self.materialize().sample_level_repeat(repeat_times))

    def unfold_column_chunks(self, n_split: int, split_keys: list[str] | None = None) -> LazyDataProto:
        return LazyDataProto.of_local(self.materialize().unfold_column_chunks(n_split, split_keys))

    def to(self, device: torch.device | str, **kwargs: Any) -> LazyDataProto:
        moved = self.read(self.tensor_keys())
        for name, tensor in moved.items():
            self.set_column(name, tensor.to(device, **kwargs))
        return self

    def make_iterator(self, *args: Any, **kwargs: Any) -> Any:
        return self.materialize().make_iterator(*args, **kwargs)

    def to_tensordict(self) -> Any:
        return self.materialize().to_tensordict()

    def save_to_disk(self, filepath: Any) -> None:
        self.materialize().save_to_disk(filepath)

    def print_size(self, prefix: str = "") -> None:
        self.materialize().print_size(prefix)

    def get_data_info(self) -> str:
        return self.materialize().get_data_info()


def _plain(data: DataProto) -> DataProto:
    return data
