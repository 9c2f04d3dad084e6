"""How a rank stops a call it is running when the driver cancels it: flag, then task cancel, then interrupt.

A cancel arrives on another thread than the method's (each executor's
control path: the one that answers stacks) and names a call, not a rank:
:func:`cancel_in_process` stops every rank of that call in this process,
in this order:

1. sets the call's :class:`~dispatchcore._worker.CancelFlag`, which
   ``Worker.cancelled()`` reads, so a method that checks it can stop where
   it chooses;
2. cancels an ``async def`` method's task on its loop: ``CancelledError``
   at its next ``await``;
3. after ``interrupt_after`` seconds, if the same call still runs, raises
   :class:`~dispatchcore.CallInterrupted` in the method's thread
   (``PyThreadState_SetAsyncExc``): at its next Python instruction.  Code
   blocked in C (a collective, a sleep) sees it only when that C call
   returns; the driver restarts such a rank after its grace period.

A cancel that arrives before the rank started the call (it was queued)
makes the rank skip it.  Only the call named by its id is ever touched:
the gate clears a pending interrupt the moment the method returns, so the
next call cannot receive it.
"""

from __future__ import annotations

import asyncio
import collections
import ctypes
import threading
from typing import Any

from .._base import CallInterrupted
from .._worker import CancelFlag

#: How long a cancelled sync method may run on, checking ``self.cancelled()``, before it is interrupted.
INTERRUPT_AFTER_S = 1.0
#: How many ids of calls cancelled before they started a rank remembers.
_DOOMED_KEPT = 256


class RunningCall:
    """The call a rank runs now: its id, thread, flag, and its task when the method is a coroutine."""

    __slots__ = ("call_id", "flag", "interrupted", "loop", "task", "thread")

    def __init__(self, call_id: int) -> None:
        self.call_id = call_id
        self.thread = threading.get_ident()
        self.flag = CancelFlag()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.task: asyncio.Task[Any] | None = None
        self.interrupted = False


class CallGate:
    """The calls the ranks of one process run now (by call id), and the ids cancelled before they began.

    One per process (:data:`GATE`): a cancel names a call, not a rank, so the
    path that receives it (a rank's control thread, a local group's driver)
    stops every rank of that call living in the process.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: dict[int, list[RunningCall]] = {}
        self._doomed: collections.deque[int] = collections.deque(maxlen=_DOOMED_KEPT)

    def enter(self, call_id: int) -> RunningCall | None:
        """Mark ``call_id`` running on this thread; ``None`` when it was cancelled before it began."""
        running = RunningCall(call_id)
        if not call_id:
            return running
        with self._lock:
            if call_id in self._doomed:
                return None
            self._running.setdefault(call_id, []).append(running)
        return running

    def leave(self, running: RunningCall) -> None:
        """The method returned: no interrupt may reach this thread any more (idempotent)."""
        with self._lock:
            calls = self._running.get(running.call_id)
            if calls is not None and running in calls:
                calls.remove(running)
                if not calls:
                    del self._running[running.call_id]
            if running.interrupted:
                running.interrupted = False
                _set_async_exc(running.thread, None)  # drop an interrupt not yet raised

    def cancel(self, call_id: int, interrupt_after: float = INTERRUPT_AFTER_S) -> int:
        """Ask every rank here running call ``call_id`` to stop; how many were; later ones skip it."""
        if not call_id:
            return 0
        with self._lock:
            if call_id not in self._doomed:
                self._doomed.append(call_id)
            found = list(self._running.get(call_id, ()))
            for running in found:
                running.flag.requested = True
        for running in found:
            loop, task = running.loop, running.task
            if loop is not None and task is not None:
                try:
                    loop.call_soon_threadsafe(task.cancel)
                except RuntimeError:  # the loop closed: the call is over
                    pass
                continue
            timer = threading.Timer(max(0.0, interrupt_after), self._interrupt, (running,))
            timer.daemon = True
            timer.start()
        return len(found)

    def _interrupt(self, running: RunningCall) -> None:
        with self._lock:
            if running not in self._running.get(running.call_id, ()) or running.interrupted:
                return
            running.interrupted = True
            _set_async_exc(running.thread, CallInterrupted)


#: This process's gate: every ``WorkerHost`` enters its calls here.
GATE = CallGate()


def cancel_in_process(call_id: int, interrupt_after: float = INTERRUPT_AFTER_S) -> int:
    """Stop call ``call_id`` on every rank of it in this process (from any thread); how many ran it.

    What an executor's control path runs when the driver cancels a call
    (``Executor.cancel_call``); ranks here that have not begun the call yet
    skip it when it comes.
    """
    return GATE.cancel(call_id, interrupt_after)


def _set_async_exc(thread: int, exc: type[BaseException] | None) -> None:
    """Raise ``exc`` in ``thread`` at its next Python instruction (``None``: clear a pending one)."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread), ctypes.py_object(exc) if exc else None)
