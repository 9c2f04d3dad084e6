"""The one call handle every executor builds on: all time bounds live here (``docs/executor-contract.md``).

A backend only says how results arrive and how a rank is seen gone.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from .._base import CallCancelledError, Latch, WorkerDiedError
from .._spi import Call, CallHandle
from ._failure_hints import with_hint
from ._timeout_wording import timeout_error
from ._worker_host import RemoteFailure, first_failure

#: Longest pause between liveness checks while a call runs.
MAX_LIVENESS_POLL_S = 0.5
#: After a rank raised, how long the call waits for other ranks' outcomes before it ends without them.
FAIL_FAST_GATHER_S = 0.05
#: The shortest wait for progress while that gather runs (its timer may fire a little late).
MIN_GATHER_SLICE_S = 0.002


def liveness_poll(death_timeout: float) -> float:
    """How often to check liveness so a death is seen well within ``death_timeout``."""
    return max(0.01, min(MAX_LIVENESS_POLL_S, death_timeout / 4))


class RankCallHandle(CallHandle):
    """One call's per-rank outcomes, filled by the backend; owns every bound (``on_broken``: the group is broken)."""

    def __init__(
        self,
        call: Call,
        *,
        death_timeout: float,
        on_broken: Callable[[str], None] = lambda reason: None,
    ) -> None:
        self.call = call
        self.poll = liveness_poll(death_timeout)
        self.death_timeout = death_timeout
        self._on_broken = on_broken
        self._submitted = time.monotonic()
        n = len(call.ranks)
        self._results: list[Any] = [None] * n
        self._failures: dict[int, RemoteFailure] = {}
        self._deaths: dict[int, str] = {}
        self._finished = [False] * n
        self._pending = n
        self._lock = threading.Lock()
        #: Set when the call ends: every rank answered, one died or raised, or it was cancelled.
        self._event = Latch()
        #: Set when every rank answered (or is gone); made only when someone waits for that (``wait_settled``).
        self._settled: Latch | None = None
        #: When the gather after a raise ends (``time.monotonic()``), once a rank raised.
        self._gather_until: float | None = None
        self._cancelled = False
        #: Set on every delivery while a stream waits for the next rank (None until one does).
        self._progress: threading.Event | None = None
        #: A stream reads this call rank by rank: a pull backend's wait_for_progress returns after the first result.
        self.streaming = False
        if not n:
            self._event.set()

    # -- what backends call -------------------------------------------------
    def deliver(self, position: int, ok: bool, value: Any) -> None:
        """Rank at ``position`` finished: ``value`` is its result, or a :class:`RemoteFailure`."""
        with self._lock:
            if self._finished[position]:
                return
            if ok:
                self._results[position] = value
            else:
                if isinstance(value, RemoteFailure) and value.rank < 0:
                    value.rank = self.call.ranks[position]
                self._failures[position] = value
                if self._gather_until is None and self._pending > 1:
                    self._gather_until = time.monotonic() + FAIL_FAST_GATHER_S
                    # The call ends FAIL_FAST_GATHER_S after a rank raised, whatever the others do.
                    timer = threading.Timer(FAIL_FAST_GATHER_S, self._event.set)
                    timer.daemon = True
                    timer.start()
            self._finish(position)

    def rank_died(self, position: int, detail: str) -> None:
        """Rank at ``position`` is gone (``detail`` says how it was seen)."""
        with self._lock:
            if self._finished[position]:
                return
            self._deaths[position] = detail
            self._finish(position)
        # A death ends the call at once, whatever the other ranks are doing.
        self._event.set()

    def _finish(self, position: int) -> None:
        self._finished[position] = True
        progress = self._progress
        if progress is not None:
            progress.set()
        self._pending -= 1
        if self._pending == 0:
            self._event.set()
            if self._settled is not None:
                self._settled.set()

    def cancel(self) -> bool:
        """End the call now as cancelled (the core then stops its ranks); ``False`` if it had ended."""
        if self.done():  # a pull backend's (Ray's) results can be ready before they are taken
            return False
        with self._lock:
            if self._event.is_set() or self._failures or self._deaths:
                return False
            self._cancelled = True
        self._event.set()
        return True

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    # -- what backends may override ------------------------------------------
    def wait_for_progress(self, seconds: float) -> None:
        """Block up to ``seconds`` for results to arrive (push backends: the default)."""
        self._event.wait(seconds)

    def check_alive(self, waiting: list[int]) -> None:
        """Call :meth:`rank_died` for positions in ``waiting`` whose rank is gone."""

    @property
    def gather_deadline(self) -> float | None:
        """When the gather after a raise ends (``time.monotonic()``; a pull backend waits no longer), or ``None``."""
        return self._gather_until

    # -- the contract --------------------------------------------------------
    def waiting_positions(self) -> list[int]:
        with self._lock:
            return [p for p, done in enumerate(self._finished) if not done]

    def waiting_ranks(self) -> list[int]:
        return [self.call.ranks[p] for p in self.waiting_positions()]

    def done(self) -> bool:
        return self._event.is_set()

    def ended(self) -> bool:
        """Whether the call has ended (what :meth:`done` says before a subclass asks its backend)."""
        return self._event.is_set()

    def position_outcome(self, position: int) -> tuple[bool, Any] | None:
        """``(True, result)`` once the rank at ``position`` answered, ``(False, None)`` if it failed or died."""
        with self._lock:
            if not self._finished[position]:
                return None
            if position in self._failures or position in self._deaths:
                return False, None
            return True, self._results[position]

    def wait_for_any(self, seconds: float) -> None:
        """Block up to ``seconds`` for one more rank to answer (call :meth:`arm` before checking first)."""
        assert self._progress is not None  # noqa: S101 - armed first
        self._wait_then_look(self._progress, seconds)

    def _wait_then_look(self, event: threading.Event | Latch, seconds: float) -> None:
        """Wait up to ``seconds`` on ``event`` (a pull backend: on its own wait), then look for dead ranks."""
        if type(self).wait_for_progress is RankCallHandle.wait_for_progress:
            event.wait(seconds)
        else:
            self.wait_for_progress(seconds)
        waiting = self.waiting_positions()
        if waiting:
            self.check_alive(waiting)

    def arm(self) -> None:
        """Start listening for the next rank's answer (see :meth:`wait_for_any`)."""
        self.streaming = True
        if self._progress is None:
            self._progress = threading.Event()
        self._progress.clear()

    def settled(self) -> bool:
        """Whether every rank of the call has answered or is gone (done can be earlier: fail fast, cancel)."""
        return self._pending == 0

    def settled_latch(self) -> Latch:
        """A latch set once every rank answered or is gone (made on first use: most calls never ask)."""
        with self._lock:
            if self._settled is None:
                self._settled = Latch()
                if self._pending == 0:
                    self._settled.set()
            return self._settled

    def wait_settled(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for every rank to answer or be seen gone; whether they did."""
        deadline = time.monotonic() + timeout
        settled = self.settled_latch()
        while not settled.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self._wait_then_look(settled, min(left, self.poll))
        return True

    def result(self, timeout: float | None = None) -> list[Any]:
        bound = self.call.timeout
        call_deadline = None if bound is None else self._submitted + bound
        wait_deadline = None if timeout is None else time.monotonic() + timeout
        while not self._event.is_set():
            now = time.monotonic()
            limits = [self.poll] + [d - now for d in (call_deadline, wait_deadline) if d is not None]
            if self._gather_until is not None:
                # A pull backend's wait cannot see the gather's end: it waits no longer than that.
                limits.append(max(MIN_GATHER_SLICE_S, self._gather_until - now))
            slice_s = min(limits)
            if slice_s > 0:
                self.wait_for_progress(slice_s)
                if self._event.is_set():
                    break
            waiting = self.waiting_positions()
            if waiting:
                self.check_alive(waiting)
                if self._event.is_set():
                    break
            now = time.monotonic()
            if call_deadline is not None and now >= call_deadline:
                ranks = self.waiting_ranks()
                self._on_broken(
                    f"call {self.call.method!r} outlived its {bound:g} s timeout and rank(s) {ranks} may "
                    "still be running it"
                )
                raise timeout_error(self.call.method, bound, ranks)
            if wait_deadline is not None and now >= wait_deadline:
                raise timeout_error(self.call.method, timeout, self.waiting_ranks())
        return self.outcome()

    def outcome(self) -> list[Any]:
        """The results once finished, or the error the call ends with."""
        if self._cancelled:
            ranks = tuple(self.waiting_ranks())
            raise CallCancelledError(
                f"call {self.call.method!r} was cancelled"
                + (f"; rank(s) {list(ranks)} had not finished it" if ranks else ""),
                method=self.call.method,
                ranks=ranks,
            )
        if self._deaths:
            position = min(self._deaths)
            rank = self.call.ranks[position]
            self._on_broken(f"rank {rank} died")
            error = WorkerDiedError(rank, self._deaths[position], self.call.method)
            others = sorted(self.call.ranks[p] for p in self._deaths if p != position)
            if others:
                error.add_note(f"rank(s) {others} died too")
            raise error
        if self._failures:
            raise with_hint(first_failure(self._failures, self.call.ranks))
        return self._results
