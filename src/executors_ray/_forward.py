"""Rank side of passing a ``DataProtoFuture`` from one Ray call into another without the driver pulling it."""

from __future__ import annotations

from typing import Any

from dispatchcore import DataProto, DispatchTypeError
from dispatchcore.executor import ResultShape, assemble_chunk

from ._store import unpack
from ._tags import Forwarded

#: Bound on fetching forwarded results, ready before the call is sent: it only guards a node lost in between.
FETCH_TIMEOUT_S = 300.0


def describe(refs: list[Any], timeout: float) -> list[ResultShape | None]:
    """Row count and ``meta_info`` of each result (``None``: a failure or not a ``DataProto``)."""
    import ray

    out: list[ResultShape | None] = []
    for result in ray.get(list(refs), timeout=timeout):
        value = _packed_dataproto(result)
        out.append(None if value is None else ResultShape(len(value), dict(value.meta_info)))
    return out


def resolve(part: Forwarded) -> DataProto:
    """This rank's chunk as a fresh, private ``DataProto``."""
    import ray

    sources = sorted(part.refs)
    fetched = ray.get([part.refs[p] for p in sources], timeout=FETCH_TIMEOUT_S)
    results = {}
    for position, result in zip(sources, fetched, strict=True):
        value = _packed_dataproto(result)
        if value is None:
            raise DispatchTypeError(f"forwarded result at position {position} is not a DataProto")
        results[position] = value
    return assemble_chunk(part.plan, results)


def _packed_dataproto(result: Any) -> DataProto | None:
    """The ``DataProto`` in a call's kept result (``take_result``), wrapped without a copy, if it is one."""
    if type(result) is not tuple or len(result) != 2:
        return None  # an object reference the worker returned
    value = unpack(result, copy=False)
    return value if isinstance(value, DataProto) else None
