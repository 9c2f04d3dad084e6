"""What a rank receives in place of a lazy DataProto argument (a :class:`LazyChunk`), and how it becomes rows."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .._base import DispatchError
from .._data import DataProto, TensorBatch
from .._trace import _driver_traffic, count_sent, count_sent_bytes
from ._column_plan import ColumnPlan, Segment, index_key, local_rows
from ._fetch import plan_requests
from ._lazy_dataproto import LazyDataProto
from ._records import ColumnSpec, RowRequest
from ._remote import RemoteRows
from ._store import ROW_STORE

#: Fetches rows for requests whose keys are not in this process (an executor's rank-to-rank transport).
RowFetcher = Callable[[Sequence[RowRequest]], list[DataProto]]


@dataclass(frozen=True)
class RequestSlot:
    """A segment's rows are the whole answer to request ``number``."""

    number: int


@dataclass
class LazyChunk:
    """A rank's chunk of a lazy DataProto, as row requests plus driver-side columns."""

    length: int
    specs: dict[str, ColumnSpec]
    plans: dict[str, ColumnPlan]
    requests: list[RowRequest]
    meta_info: dict[str, Any]
    has_batch: bool

    @classmethod
    def of(cls, data: LazyDataProto) -> LazyChunk:
        requests, slots = plan_requests(data._plans)
        plans = {}
        for name, plan in data._plans.items():
            segments = []
            for segment in plan.segments:
                if isinstance(segment.source, RemoteRows):
                    slot = RequestSlot(slots[(id(segment.source), index_key(segment.index))])
                    segments.append(Segment(slot, slice(0, len(segment))))
                else:  # only these rows of a driver-side column travel
                    rows = local_rows(segment)
                    segments.append(Segment(rows, slice(0, len(rows))))
            plans[name] = ColumnPlan(tuple(segments), plan.order)
        return cls(len(data), dict(data._specs), plans, [r for _, r in requests], dict(data.meta_info), data._has_batch)

    def resolve(self, fetch: RowFetcher | None, fetched_private: bool = False, share_local: bool = False) -> DataProto:
        """The chunk's rows as a DataProto the worker may write to.

        A lone part ``fetch`` returned is used uncopied when ``fetched_private``; rows kept here when ``share_local``.
        """
        fetched = read_rows(self.requests, fetch)
        local = {i for i, r in enumerate(self.requests) if ROW_STORE.has(r.key)}

        def owned(segment: Segment) -> bool:
            if not isinstance(segment.source, RequestSlot):
                return False
            return share_local if segment.source.number in local else fetched_private

        tensors: dict[str, Any] = {}
        arrays: dict[str, Any] = {}
        for name, plan in self.plans.items():

            def rows_of(segment: Segment, name: str = name) -> Any:
                if isinstance(segment.source, RequestSlot):
                    part = fetched[segment.source.number]
                    return part.batch[name] if self.specs[name].tensor else part.non_tensor_batch[name]
                return segment.source

            column = plan.assemble(rows_of, owned) if plan.segments else self.specs[name].empty(self.length)
            (tensors if self.specs[name].tensor else arrays)[name] = column
        batch = TensorBatch(tensors, batch_size=[self.length]) if self.has_batch else None
        return DataProto(batch=batch, non_tensor_batch=arrays, meta_info=self.meta_info)

    def local_bytes(self) -> int:
        sources = [s.source for p in self.plans.values() for s in p.segments if not isinstance(s.source, RequestSlot)]
        return sum(s.numel() * s.element_size() if hasattr(s, "numel") else s.nbytes for s in sources)


def read_rows(requests: Sequence[RowRequest], fetch: RowFetcher | None) -> list[DataProto]:
    """Rank side: each request's rows, from this process's store or through ``fetch``."""
    out: list[DataProto | None] = [None] * len(requests)
    remote: list[int] = []
    for i, request in enumerate(requests):
        if ROW_STORE.has(request.key):
            out[i] = ROW_STORE.take(request)
        else:
            remote.append(i)
    if remote:
        if fetch is None:
            raise DispatchError(
                f"this rank cannot reach rows kept by rank {requests[remote[0]].rank}: its backend moves no rows "
                "between ranks (the driver should have sent them; please report this)"
            )
        for i, part in zip(remote, fetch([requests[i] for i in remote]), strict=True):
            out[i] = part
    return [part for part in out if part is not None]


def resolve_lazy_arguments(
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    fetch: RowFetcher | None,
    fetched_private: bool = False,
    share_local: bool = False,
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Rank side: every :class:`LazyChunk` argument replaced by its rows."""
    if not any(isinstance(a, LazyChunk) for a in args) and not any(isinstance(v, LazyChunk) for v in kwargs.values()):
        return args, kwargs
    resolved: dict[int, DataProto] = {}

    def value(v: Any) -> Any:
        if not isinstance(v, LazyChunk):
            return v
        if id(v) not in resolved:
            resolved[id(v)] = v.resolve(fetch, fetched_private, share_local)
        return resolved[id(v)]

    return tuple(value(a) for a in args), {k: value(v) for k, v in kwargs.items()}


def send_lazy_arguments(
    executor: Any, per_rank: Sequence[Sequence[Any]]
) -> tuple[Sequence[Sequence[Any]], list[RemoteRows]]:
    """Driver side: per-rank arguments with each lazy DataProto a LazyChunk, and the remote results they read."""
    lazy = any(isinstance(v, LazyDataProto) for values in per_rank for v in values)
    if _driver_traffic.counting:
        count_sent([v for values in per_rank for v in values if not isinstance(v, LazyDataProto)])
    if not lazy:
        return per_rank, []
    converted: dict[int, Any] = {}
    sources: dict[int, RemoteRows] = {}
    out = []
    for values in per_rank:
        row = []
        for v in values:
            if isinstance(v, LazyDataProto):
                if id(v) not in converted:
                    remote = v.remote_sources()
                    if remote and all(executor.can_fetch_rows(s.address) for s in remote):
                        chunk = LazyChunk.of(v)
                        count_sent_bytes(chunk.local_bytes())
                        converted[id(v)] = chunk
                        sources.update((id(s), s) for s in remote)
                    else:
                        converted[id(v)] = v.materialize()
                        count_sent([converted[id(v)]])
                v = converted[id(v)]
            row.append(v)
        out.append(row)
    return out, list(sources.values())
