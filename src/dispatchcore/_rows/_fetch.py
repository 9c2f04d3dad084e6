"""Reading the rows a lazy column plan names: one request per source and row range."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .._data import DataProto
from ._column_plan import ColumnPlan, Segment, index_key, local_rows
from ._records import ColumnSpec
from ._remote import RemoteRows


def plan_requests(plans: Mapping[str, ColumnPlan]) -> tuple[list[tuple[RemoteRows, Any]], dict[tuple[int, Any], int]]:
    """``(source, RowRequest)`` pairs, one per (remote source, row index) with every column it serves; their slots."""
    columns: dict[tuple[int, Any], list[str]] = {}
    first: dict[tuple[int, Any], Segment] = {}
    for name, plan in plans.items():
        for segment in plan.segments:
            if isinstance(segment.source, RemoteRows):
                slot = (id(segment.source), index_key(segment.index))
                columns.setdefault(slot, []).append(name)
                first.setdefault(slot, segment)
    slots = {slot: i for i, slot in enumerate(columns)}
    requests = [(first[slot].source, first[slot].source.request(columns[slot], first[slot].index)) for slot in columns]
    return requests, slots


def assemble_column(
    plan: ColumnPlan,
    spec: ColumnSpec,
    length: int,
    name: str,
    slots: Mapping[tuple[int, Any], int],
    fetched: Sequence[DataProto],
) -> Any:
    """Column ``name``: each segment's rows (fetched or local), joined and reordered (a private copy)."""

    def rows_of(segment: Segment) -> Any:
        if isinstance(segment.source, RemoteRows):
            part = fetched[slots[(id(segment.source), index_key(segment.index))]]
            return part.batch[name] if spec.tensor else part.non_tensor_batch[name]
        return local_rows(segment)

    return plan.assemble(rows_of) if plan.segments else spec.empty(length, spec.device)


def fetch_on_driver(requests: Sequence[tuple[RemoteRows, Any]], timeout: float | None) -> list[DataProto]:
    """Rows for ``requests`` read to the driver, grouped by the group (ledger) holding them (not yet counted)."""
    out: list[DataProto | None] = [None] * len(requests)
    by_ledger: dict[int, tuple[Any, list[int]]] = {}
    for i, (source, _) in enumerate(requests):
        by_ledger.setdefault(id(source.ledger), (source.ledger, []))[1].append(i)
    for ledger, positions in by_ledger.values():
        parts = ledger.read([requests[i][1] for i in positions], timeout)
        for i, part in zip(positions, parts, strict=True):
            out[i] = part
    return [p for p in out if p is not None]  # the caller counts them as driver traffic
