"""Stage 4 of a call: the mode's ``collect_fn`` under the call's collect plan (lazy results become handles)."""

from __future__ import annotations

import contextlib
from typing import Any

from .._dispatch import enter_call, leave_call
from .._rows import LazyDataProto, RemoteRows
from .._trace import count_received
from .._wire import RowBuffers, adopting
from ._planned import PlannedCall
from ._site import CallSite
from ._tracing import CallTrace


def collect(
    group: Any,
    site: CallSite,
    planned: PlannedCall,
    results: list[Any],
    row_buffers: RowBuffers | None,
    trace: CallTrace | None,
) -> Any:
    """The caller's value from the ranks' ``results`` (in call order)."""
    if planned.lazy:
        adopted = site.shared.ledger.adopt(planned.call.ranks, results)
        results = [LazyDataProto.of_remote(r) if isinstance(r, RemoteRows) else r for r in adopted]
    else:
        count_received(results)
    if planned.unwrap:
        return results[0]
    ctx = planned.context
    ctx.row_buffers = row_buffers
    token = enter_call(ctx)
    try:
        if trace is None and planned.spec.builtin:  # the common case: no scope to open
            return planned.spec.collect_fn(group, results)
        # A user-defined collect cannot be handed the buffers (verl's signature): it gets them from the wire layer.
        scope = contextlib.nullcontext() if planned.spec.builtin else adopting(row_buffers)
        with scope, trace.collecting() if trace is not None else contextlib.nullcontext():
            return planned.spec.collect_fn(group, results)
    finally:
        leave_call(token)
        ctx.row_buffers = None  # claimable once: a retried collect copies
