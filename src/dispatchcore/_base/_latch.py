"""A one-shot signal for one call: ``threading.Event``'s behaviour on a bare lock.

An ``Event`` builds a ``Condition`` per event and a lock per wait (a third of the local per-call cost).
"""

from __future__ import annotations

import _thread


class Latch:
    """``threading.Event``'s ``set``, ``is_set`` and ``wait``, without ``clear`` (a latch opens once)."""

    __slots__ = ("_lock", "_open")

    def __init__(self) -> None:
        self._lock = _thread.allocate_lock()
        self._lock.acquire()
        self._open = False

    def set(self) -> None:
        self._open = True
        try:
            self._lock.release()
        except RuntimeError:  # already open (set twice, or a waiter passing it on right now)
            pass

    def is_set(self) -> bool:
        return self._open

    def wait(self, timeout: float | None = None) -> bool:
        """Block until set or ``timeout`` seconds pass; whether it is set."""
        if self._open:
            return True
        if self._lock.acquire(timeout=-1 if timeout is None else max(0.0, timeout)):
            try:
                self._lock.release()  # pass it on to any other waiter
            except RuntimeError:  # a second set() released it meanwhile: it stays open either way
                pass
            return True
        return self._open
