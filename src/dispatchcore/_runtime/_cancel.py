"""How a rank stops a call it is running when the driver cancels it: flag, then task cancel, then interrupt.

A cancel arrives on another thread than the method's (each executor's
control path: the one that answers stacks) and names a call, not a rank:
:func:`cancel_in_process` stops every rank of that call in this process,
in this order:

1. sets the call's :class:`~dispatchcore._worker.CancelFlag`, which
   ``Worker.cancelled()`` reads, so a method that checks it can stop where
   it chooses;
2. aborts the communicators the library made for the group
   (``dispatchcore.collective``'s, ``collective.init_process_group``'s) on
   every rank, idle ones included, so a rank blocked in one of their
   collectives raises at once (``docs/process-groups.md``);
3. cancels an ``async def`` method's task on its loop: ``CancelledError``
   at its next ``await``;
4. after ``interrupt_after`` seconds, if the same call still runs, raises
   :class:`~dispatchcore.CallInterrupted` in the method's thread
   (``PyThreadState_SetAsyncExc``): at its next Python instruction.  Code
   blocked in other C (a sleep, a user's own process group) sees it only
   when that C call returns; the driver restarts such a rank after its
   grace period.  Where the process's main thread runs the methods and
   :func:`install_cancel_signal` ran there (torchrun's self-started
   ranks), the interrupt is :data:`INTERRUPT_SIGNAL` sent to that thread
   instead: it also ends a blocking system call (``time.sleep``, a socket,
   a subprocess wait), whose handler then raises ``CallInterrupted``.

A cancel that arrives before the rank started the call (it was queued)
makes the rank skip it.  Only the call named by its id is ever touched:
the gate clears a pending interrupt the moment the method returns, so the
next call cannot receive it (a signal that lands later finds no interrupted
call and does nothing).
"""

from __future__ import annotations

import asyncio
import collections
import ctypes
import signal
import threading
from threading import get_ident
from typing import Any

from .._base import CallInterrupted
from .._worker import CancelFlag

#: How long a cancelled sync method may run on, checking ``self.cancelled()``, before it is interrupted.
INTERRUPT_AFTER_S = 1.0
#: How many ids of calls cancelled before they started a rank remembers.
_DOOMED_KEPT = 256
#: The interrupt's signal is sent again this often until its handler has raised (at most ``_RESIGNALS`` times):
#: one that lands inside ``time.sleep`` just before the system call starts is handled only once it returns.
RESIGNAL_S = 0.25
_RESIGNALS = 40
#: What interrupts a main thread's blocking system call: a real-time signal, which torch, torchrun
#: (it forwards SIGUSR1/2 under SLURM) and Ray leave alone (``None`` where the platform has none).
INTERRUPT_SIGNAL: int | None = signal.SIGRTMIN + 3 if hasattr(signal, "SIGRTMIN") else None


class RunningCall(CancelFlag):
    """The call a rank runs now: its id, thread, whether it was cancelled, its task if a coroutine.

    It is the flag ``Worker.cancelled()`` reads (``requested``), so entering a call makes one object;
    what only a cancel or a coroutine sets starts as a class default, not set on every call.
    """

    __slots__ = ("__dict__",)

    requested = False
    link: Any = None
    interrupted = False
    #: The signal's handler raised ``CallInterrupted`` here already (it raises once per interrupt).
    signalled = False
    loop: asyncio.AbstractEventLoop | None = None
    task: asyncio.Task[Any] | None = None

    def __init__(self, call_id: int, thread: int, outer: RunningCall | None) -> None:
        self.call_id = call_id
        self.thread = thread
        #: The call this thread ran before this one began (a call made from inside a method), restored after.
        self.outer = outer


class CallGate:
    """The call each thread of this process runs now, and the ids of calls cancelled before they began.

    One per process (:data:`GATE`): a cancel names a call, not a rank, so the
    path that receives it (a rank's control thread, a local group's driver)
    stops every rank of that call living in the process.  Entering and
    leaving a call, on every call of every rank, take no lock (a dict write
    under the GIL); a cancel, which is rare, scans the threads' calls and
    takes the lock that orders an interrupt against the method's return.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_thread: dict[int, RunningCall] = {}
        self._doomed: set[int] = set()
        self._doomed_order: collections.deque[int] = collections.deque()
        #: The main thread, once :func:`install_cancel_signal` put the handler there.
        self.signal_thread: int | None = None

    def enter(self, call_id: int) -> RunningCall | None:
        """Mark ``call_id`` running on this thread; ``None`` when it was cancelled before it began."""
        thread = get_ident()
        by_thread = self._by_thread
        running = RunningCall(call_id, thread, by_thread.get(thread))
        by_thread[thread] = running  # published before the doomed check: a cancel sees one or the other
        if call_id and call_id in self._doomed:
            self._restore(running)
            return None
        return running

    def leave(self, running: RunningCall) -> None:
        """The method returned: no interrupt may reach this thread any more (idempotent)."""
        if self._by_thread.get(running.thread) is running:
            self._restore(running)
        if running.requested:  # a cancel came: order against its interrupt, drop one not yet raised
            with self._lock:
                if running.interrupted:
                    running.interrupted = False
                    _set_async_exc(running.thread, None)

    def _restore(self, running: RunningCall) -> None:
        if running.outer is None:
            self._by_thread.pop(running.thread, None)
        else:
            self._by_thread[running.thread] = running.outer

    def cancel(self, call_id: int, interrupt_after: float = INTERRUPT_AFTER_S) -> int:
        """Ask every rank here running call ``call_id`` to stop; how many were; later ones skip it."""
        if not call_id:
            return 0
        with self._lock:
            if call_id not in self._doomed:
                self._doomed.add(call_id)
                self._doomed_order.append(call_id)
                if len(self._doomed_order) > _DOOMED_KEPT:
                    self._doomed.discard(self._doomed_order.popleft())
            found = []
            for innermost in list(self._by_thread.values()):
                running: RunningCall | None = innermost
                while running is not None:  # a call made from inside a method: its outer calls too
                    if running.call_id == call_id:
                        running.requested = True
                        found.append(running)
                    running = running.outer
        for stopping in found:
            _abort_collectives(stopping)
            loop, task = stopping.loop, stopping.task
            if loop is not None and task is not None:
                try:
                    loop.call_soon_threadsafe(task.cancel)
                except RuntimeError:  # the loop closed: the call is over
                    pass
                continue
            timer = threading.Timer(max(0.0, interrupt_after), self._interrupt, (stopping,))
            timer.daemon = True
            timer.start()
        return len(found)

    def _interrupt(self, running: RunningCall) -> None:
        with self._lock:
            if self._by_thread.get(running.thread) is not running or running.interrupted:
                return  # it returned (or a call it made runs now: interrupt only the innermost call)
            running.interrupted = True
            if running.thread == self.signal_thread and signal.getsignal(INTERRUPT_SIGNAL) is _on_signal:  # type: ignore[arg-type]
                signal.pthread_kill(running.thread, INTERRUPT_SIGNAL)  # type: ignore[arg-type]
                self._signal_again(running, _RESIGNALS)
            else:
                _set_async_exc(running.thread, CallInterrupted)

    def _signal_again(self, running: RunningCall, times: int) -> None:
        """Send the signal again after :data:`RESIGNAL_S` while the call runs and its handler has not raised."""
        if times <= 0:
            return
        timer = threading.Timer(RESIGNAL_S, self._resignal, (running, times - 1))
        timer.daemon = True
        timer.start()

    def _resignal(self, running: RunningCall, times: int) -> None:
        with self._lock:
            if self._by_thread.get(running.thread) is not running or running.signalled:
                return  # it returned, or the handler raised in it
            if signal.getsignal(INTERRUPT_SIGNAL) is not _on_signal:  # type: ignore[arg-type]
                return  # the handler was taken away (the process's own now)
            signal.pthread_kill(running.thread, INTERRUPT_SIGNAL)  # type: ignore[arg-type]
        self._signal_again(running, times)


#: This process's gate: every ``WorkerHost`` enters its calls here.
GATE = CallGate()


def cancel_in_process(call_id: int, interrupt_after: float = INTERRUPT_AFTER_S) -> int:
    """Stop call ``call_id`` on every rank of it in this process (from any thread); how many ran it.

    What an executor's control path runs when the driver cancels a call
    (``Executor.cancel_call``); ranks here that have not begun the call yet
    skip it when it comes.
    """
    return GATE.cancel(call_id, interrupt_after)


def install_cancel_signal() -> bool:
    """On the main thread that runs this process's rank methods: let a cancel's interrupt end a blocking system call.

    ``time.sleep``, a socket or a subprocess wait then ends in ``CallInterrupted``
    and the rank takes the next call, not a restart (``docs/calls-that-cannot-hang.md``).
    Returns whether it is in place: never off the main thread, nor where
    :data:`INTERRUPT_SIGNAL` has a handler already (the process's own: left alone).
    """
    if INTERRUPT_SIGNAL is None or threading.current_thread() is not threading.main_thread():
        return False
    if signal.getsignal(INTERRUPT_SIGNAL) is not _on_signal:
        if signal.getsignal(INTERRUPT_SIGNAL) is not signal.SIG_DFL:
            return False
        signal.signal(INTERRUPT_SIGNAL, _on_signal)
    GATE.signal_thread = get_ident()
    return True


def _on_signal(signum: int, frame: object) -> None:
    """On the main thread: raise ``CallInterrupted`` in the call an interrupt is pending for, once; else nothing.

    No lock (the main thread may hold the gate's): a call that returned is
    no longer the thread's, so a late signal finds nothing to interrupt.
    """
    running = GATE._by_thread.get(get_ident())  # noqa: SLF001 - the gate's own handler
    if running is not None and running.interrupted and not running.signalled:
        running.signalled = True
        raise CallInterrupted


def _abort_collectives(running: RunningCall) -> None:
    """Free the call's ranks blocked in a collective: its group is aborted on every rank of it."""
    if running.link is not None:
        try:
            running.link.abort()
        except Exception:  # noqa: BLE001 - the interrupt and cancel_grace still apply
            pass


def _set_async_exc(thread: int, exc: type[BaseException] | None) -> None:
    """Raise ``exc`` in ``thread`` at its next Python instruction (``None``: clear a pending one)."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread), ctypes.py_object(exc) if exc else None)
