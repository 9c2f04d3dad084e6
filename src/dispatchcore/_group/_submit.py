"""The one way the core sends a call, so each settles stragglers, carries frees, is traced and fails alike.

Beside calls (``Call.beside``) neither wait for stragglers nor become ones.  The core's own calls
(weight sync's steps, a rejoin, the row ledger's reads) come in through ``CallSite.submit``; this
module reads a call site but does not import it (``_site`` imports this one).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from .._spi import Call, CallHandle
from ._call_checks import submit_call
from ._sharded_check import check_before
from ._stuck import clear_stragglers, ended_early
from ._tracing import CallTrace

#: Sentinel: wait as long as the call's own bound (``Call.timeout``).
CALL_BOUND: Any = object()
#: Sentinel: begin the call's trace here (inside a trace block).
BEGIN: Any = object()


@dataclass(slots=True, eq=False)
class Submitted:
    """A sent call: its executor's handle, and the pipeline's way to wait for it."""

    call: Call
    handle: CallHandle
    #: The ``CallSite`` it went through.
    site: Any
    trace: CallTrace | None

    def result(self, timeout: float | None = CALL_BOUND) -> list[Any]:
        """Each rank's value; an error ends the call the pipeline's way (stacks noted, ranks asked to stop)."""
        call = self.call
        try:
            results = self.handle.result(call.timeout if timeout is CALL_BOUND else timeout)
        except BaseException as exc:
            if not call.beside:
                instead = ended_early(self.site, self.handle, call, exc, self.trace)
                if instead is not None:
                    raise instead from None
            raise
        if self.trace is not None:
            results = self.trace.executed(call, results)
        return results

    def done(self) -> bool:
        return self.handle.done()


def submit(group: Any, site: Any, call: Call, trace: CallTrace | None = BEGIN, *, settled: bool = False) -> Submitted:
    """Send ``call`` to ``site``'s executor (a ``CallSite``; ``group`` names the group in errors).

    ``trace``: one the caller began (or ``None``); ``settled``: the caller settled stragglers already.
    """
    if trace is BEGIN:
        trace = CallTrace.begin(site.shared.label, "", call.method)
    return Submitted(call, send(group, site, call, trace, settled), site, trace)


def send(group: Any, site: Any, call: Call, trace: CallTrace | None, settled: bool) -> CallHandle:
    """:func:`submit` for a caller that waits its own way (``run_call``: retries, cancels): the handle only."""
    shared = site.shared
    beside = call.beside
    if not (settled or beside):
        clear_stragglers(group, site, call.ranks)
    if shared.sharded_check_due:
        check_before(site, call)
    if trace is not None:
        trace.dispatched(call)
    ledger = shared.ledger
    if beside or not ledger.unfreed:  # no frees queued (the usual case): nothing to attach
        handle = submit_call(shared.executor, call, shared.backend)
        shared.calls.add(handle)
        return handle
    frees = ledger.take_frees(call.ranks)
    if frees:
        call.instructions = replace(call.instructions, free=tuple(k for keys in frees.values() for k in keys))
    try:
        handle = submit_call(shared.executor, call, shared.backend)
    except BaseException:
        ledger.give_back(frees)
        raise
    shared.calls.add(handle)
    return handle
