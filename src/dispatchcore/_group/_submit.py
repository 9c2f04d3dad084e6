"""The one way the core sends a call: every call it makes goes through :func:`submit`.

Registered methods (``run_call``), streams, calls by name (``execute_all``),
the rejoin after a replacement, the row ledger's reads and frees, and the
steps of a weight transfer all go through here, so the same things hold for
each: no rank of the call is still in an earlier call that ended (stragglers
settled, ``_stuck``); rows the driver let go of ride along
(``Instructions.free``); inside a ``dispatchcore.trace`` block the call is
traced; a backend's exception reads the same (``_call_checks.submit_call``);
and :meth:`Submitted.result` waits within the call's bound, marks unfinished
ranks on the trace and asks them to stop when the call ends early.  Beside
calls (``Call.beside``) never queue behind a rank's running call, so they
neither wait for stragglers nor become ones, and carry their frees in their
own argument.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from .._base import DispatchError
from .._spi import Call, CallHandle
from ._call_checks import submit_call
from ._site import CallSite, SharedRanks
from ._stuck import clear_stragglers, ended_early
from ._tracing import CallTrace

#: Sentinel: wait as long as the call's own bound (``Call.timeout``).
CALL_BOUND: Any = object()
#: Sentinel: begin the call's trace here (inside a trace block).
BEGIN: Any = object()


class Submitted:
    """A sent call: its executor's handle, and the pipeline's way to wait for it."""

    __slots__ = ("call", "handle", "site", "trace")

    def __init__(self, call: Call, handle: CallHandle, site: CallSite, trace: CallTrace | None) -> None:
        self.call = call
        self.handle = handle
        self.site = site
        self.trace = trace

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


def submit(
    group: Any, site: CallSite, call: Call, trace: CallTrace | None = BEGIN, *, settled: bool = False
) -> Submitted:
    """Send ``call`` to ``site``'s executor (``group`` names the group in errors and is what a restart rebuilds).

    ``trace``: the call's trace (or ``None``) when the caller began it
    earlier; by default one is begun here inside a trace block.
    ``settled``: the caller settled stragglers already (a registered call
    or stream, before planning; the rejoin of a replacement, which settles
    them itself and must not again).
    """
    if trace is BEGIN:
        trace = CallTrace.begin(site.shared.label, "", call.method)
    return Submitted(call, send(group, site, call, trace, settled), site, trace)


def send(group: Any, site: CallSite, call: Call, trace: CallTrace | None, settled: bool) -> CallHandle:
    """:func:`submit` for a caller that waits its own way (``run_call``: retries, cancels): the handle only."""
    shared = site.shared
    beside = call.beside
    if not (settled or beside):
        clear_stragglers(group, site, call.ranks)
    if trace is not None:
        trace.dispatched(call)
    ledger = shared.ledger
    if beside or not ledger.unfreed:  # no frees queued (the usual case): nothing to attach
        return submit_call(shared.executor, call, shared.backend)
    frees = ledger.take_frees(call.ranks)
    if frees:
        call.instructions = replace(call.instructions, free=tuple(k for keys in frees.values() for k in keys))
    try:
        return submit_call(shared.executor, call, shared.backend)
    except BaseException:
        ledger.give_back(frees)
        raise


def ledger_sender(shared: SharedRanks, ranks: tuple[int, ...]) -> Callable[[Call], Submitted]:
    """What the row ledger sends its beside calls with: this path, over the group's ``ranks``.

    Holds the shared ranks weakly, as the ledger holds its executor, so rows
    outliving their group never keep it alive.
    """
    ref = weakref.ref(shared)

    def send(call: Call) -> Submitted:
        found = ref()
        if found is None:
            raise DispatchError("the group holding these lazy rows was shut down; its rows are gone")
        return submit(None, CallSite(found, ranks, "", None), call)

    return send
