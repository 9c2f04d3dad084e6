"""The stuck-ranks hooks of the call pipeline: where unfinished ranks are, and what becomes of them.

See ``docs/calls-that-cannot-hang.md``.
"""

from __future__ import annotations

import time
from typing import Any, Protocol

from .._base import CallCancelledError, DispatchError, DispatchTimeoutError, WorkerDiedError, WorkerError
from .._runtime import note_stacks_soon, timeout_error
from .._spi import Call, CallHandle, Executor
from ._stragglers import unfinished_ranks


class CallSite(Protocol):
    """What these hooks read of ``_site.CallSite`` (not imported: the submit path stays a floor lower)."""

    shared: Any
    ranks: tuple[int, ...]

    @property
    def executor(self) -> Executor: ...


def note_stacks(site: CallSite, error: BaseException, ranks: list[int] | None = None) -> None:
    """Add the stacks of ``ranks`` (default: the ranks ``error`` names) to it, as a note (``note_stacks_soon``)."""
    ranks = list(getattr(error, "ranks", ()) or ()) if ranks is None else ranks
    if ranks:
        note_stacks_soon(lambda asked, within: site.executor.rank_stacks(asked, False, within), error, ranks)


def clear_stragglers(group: Any, site: CallSite, ranks: tuple[int, ...] | None = None) -> None:
    """Before a call on ``ranks`` (default: ``site``'s): no rank of it may still be in an earlier, ended call."""
    shared = site.shared
    membership = shared.membership
    if not membership.stragglers:
        return
    stuck = membership.stragglers.settle(site.ranks if ranks is None else ranks, membership.cancel_grace)
    if not stuck:
        return
    stuck_ranks = sorted(stuck)
    first = stuck[stuck_ranks[0]]
    executor = site.executor
    what = (
        f"rank(s) {stuck_ranks} are still running {first.method!r}, "
        f"{time.monotonic() - first.since:.1f} s after they were asked to stop (the call ended because {first.why}); "
        "a rank that does not leave a call is blocked in C code (a collective, a sleep) or ignores the interrupt"
    )
    if executor.can_replace_ranks():
        if shared.on_rank_death == "replace":
            root = shared.root() if shared.root is not None else None
            membership.replace(root if root is not None else group, tuple(stuck_ranks), "stuck")
            return
        error = DispatchError(
            f"{what}. Restart them with wg.replace_rank({', '.join(map(str, stuck_ranks))}) (setup is replayed and "
            "on_membership_change runs on every rank), or create the group with on_rank_death='replace' to "
            "have that done before the next call"
        )
    else:
        reason = f"{what}, and the {shared.backend!r} backend cannot restart ranks"
        executor.mark_broken(reason)
        error = DispatchError(
            f"{group!r} can take no more calls: {reason}. Shut it down (shutdown() returns at once) and "
            "create a new group"
        )
    error.ranks = tuple(stuck_ranks)  # type: ignore[attr-defined]
    note_stacks(site, error, stuck_ranks)
    raise error


def cancel_on_ranks(site: CallSite, handle: CallHandle, call: Call, why: str) -> bool:
    """End ``handle``'s call as cancelled and ask its ranks still running to stop; ``False`` if it had ended."""
    end = getattr(handle, "cancel", None)
    if end is None or not end():
        return False
    site.shared.sharded_check_due = True  # the next call checks sharded state first (_sharded_check)
    _forget_kept(site, call)
    site.shared.membership.stragglers.track(site.executor, handle, call, why)
    return True


def _forget_kept(site: CallSite, call: Call) -> None:
    """A lazy call that ended early is never adopted: queue frees of what its ranks keep (``RowLedger.forget``)."""
    keep = call.instructions.keep_rows
    if keep is not None:
        site.shared.ledger.forget(call.ranks, keep)


def ended_early(
    site: CallSite,
    handle: CallHandle,
    call: Call,
    exc: BaseException,
    trace: Any,
    *,
    cancel_after: float | None = None,
) -> BaseException | None:
    """``call`` ended in ``exc``: say where its unfinished ranks are, mark them on ``trace``, ask them to stop.

    A timeout stops them only with ``cancel_after``; the error to raise instead is then returned.
    """
    site.shared.sharded_check_due = True  # the next call checks sharded state first (_sharded_check)
    _forget_kept(site, call)
    if isinstance(exc, CallCancelledError):
        return None
    if isinstance(exc, DispatchTimeoutError):
        instead = None
        if cancel_after is not None and cancel_on_ranks(site, handle, call, "it outlived its timeout"):
            exc = instead = timeout_error(call.method, cancel_after, list(exc.ranks))
            exc.add_note("on_timeout='cancel': the call was cancelled on its ranks; the group takes calls again")
        note_stacks(site, exc)
        if trace is not None and exc.ranks:
            trace.unfinished(list(exc.ranks), "timed out")
        return instead
    if isinstance(exc, KeyboardInterrupt):
        cancel_on_ranks(site, handle, call, "the driver was interrupted")
        return None
    if isinstance(exc, WorkerDiedError):
        why = f"rank {exc.rank} died"
    elif isinstance(exc, WorkerError):
        why = f"rank {exc.rank} raised {exc.exc_type}"
    else:
        return None
    running = unfinished_ranks(handle, call)
    if running:
        exc.add_note(
            f"rank(s) {running} had not finished {call.method!r} when {why}; they were asked to stop "
            f"(the next call waits up to cancel_grace={site.shared.membership.cancel_grace:g} s for them to leave it)"
        )
        note_stacks(site, exc, running)
        site.shared.membership.stragglers.track(site.executor, handle, call, why)
        if trace is not None:
            trace.unfinished(running, why)
    return None
