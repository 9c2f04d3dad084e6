"""One call through a group, top to bottom: plan → submit → resolve → collect.

``wg.update_actor(batch)`` is its method proxy calling :func:`run_call`.
Each stage lives in a module of its own; what used to be a branch inside the
call is a hook between stages (tracing: ``_tracing``, replacement and retry:
``_retry``, setup recording: the group's setup log, lazy adoption and
driver-traffic counting: ``_collect``).  A new capability adds a stage or a
hook here, not a branch in every stage.
"""

from __future__ import annotations

import time
from typing import Any

from .._base._errors import DispatchError, WorkerDiedError
from .._dispatch._futures import CallFuture, DataProtoFuture
from .._dispatch._modes import resolve_mode
from .._dispatch._register import Registration
from .._spi._executor_base import CallHandle, remaining
from ._call_checks import submit_call
from ._collect import collect
from ._plan import PlannedCall, plan_call
from ._retry import should_retry
from ._site import CallSite
from ._tracing import CallTrace


def run_call(
    group: Any,
    site: CallSite,
    name: str,
    registration: Registration,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    timeout: float | None,
    lazy: bool | None,
    retried: bool = False,
) -> Any:
    """Run registered method ``name`` on ``site``'s ranks; the collected result, or a future of it."""
    spec = resolve_mode(registration.dispatch_mode)
    if spec.direct:
        raise DispatchError(
            f"{name!r} is registered with Dispatch.DIRECT_ROLLOUT_METHOD: call it on the workers "
            "directly, not through the WorkerGroup"
        )
    site.check_open(group)
    site.shared.ledger.flush()
    trace = CallTrace.begin(site.shared.label, site.prefix, name)
    planned = plan_call(group, site, name, registration, spec, args, kwargs, timeout, lazy)
    if trace is not None:
        trace.dispatched(planned.call)
    handle = submit_call(site.executor, planned.call, site.shared.backend)
    deadline = None if timeout is None else time.monotonic() + timeout

    def resolve(wait: float | None) -> Any:
        try:
            results = handle.result(remaining(deadline) if wait is None else wait)
        except WorkerDiedError as exc:
            if not should_retry(group, site, exc, registration, planned.call.method, planned.generation, retried):
                raise
            again = run_call(group, site, name, registration, args, kwargs, timeout, planned.lazy, retried=True)
            return again if registration.blocking else again.get()
        return _finish(group, site, registration, planned, handle, results, trace)

    if registration.blocking:
        return resolve(None)
    if spec.returns_dataproto:
        ctx = planned.context
        return DataProtoFuture(
            resolve,
            handle.done,
            handle=handle,
            executor=site.executor,
            call=planned.call,
            collect_positions=ctx.collect_positions,
            pad_size=ctx.pad_size,
            padded_len=ctx.padded_len,
        )
    return CallFuture(resolve, handle.done)


def _finish(
    group: Any,
    site: CallSite,
    registration: Registration,
    planned: PlannedCall,
    handle: CallHandle,
    results: list[Any],
    trace: CallTrace | None,
) -> Any:
    """After the ranks answered: free what the call read, record setup, trace, collect."""
    del planned.read_sources[:]  # the call is over: the rows it read may be freed
    if registration.setup:
        site.shared.membership.setup_log.record(planned.call)
    if trace is not None:
        results = trace.executed(planned.call, results)
    return collect(group, site, planned, results, handle.row_buffers, trace)
