"""The one thread a rank's worker methods run on, whichever way a call arrived.

A call can reach a rank actor as a Ray task (start-up, verl's plain calls,
the old path) or on the control lane (every call once the lane is up).  CUDA's
current device and thread-locals are per thread, so both paths hand the
method to this thread, where the worker's ``__init__`` ran too: one FIFO
queue, one thread, for the actor's life.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

Job = Callable[[], None]


class MethodThread:
    """Runs jobs one at a time, in the order they were handed over."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        started = threading.Event()
        self._thread = threading.Thread(target=self._loop, args=(started,), name="dispatchcore-methods", daemon=True)
        self._thread.start()
        started.wait()
        #: ``threading.get_ident()`` of the thread (where stacks are read).
        self.ident = self._thread.ident

    def submit(self, job: Job) -> None:
        """Queue ``job`` (it must report its own errors); returns at once."""
        self._jobs.put(job)

    def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn(*args)`` on the thread and wait for its result (or its exception)."""
        if threading.get_ident() == self.ident:
            return fn(*args)
        done = threading.Event()
        box: list[Any] = []

        def job() -> None:
            try:
                box.append((True, fn(*args)))
            except BaseException as exc:  # noqa: BLE001 - raised again in the caller's thread
                box.append((False, exc))
            done.set()

        self._jobs.put(job)
        done.wait()
        ok, value = box[0]
        if not ok:
            raise value
        return value

    def stop(self) -> None:
        """End the thread after the jobs already queued."""
        self._jobs.put(None)

    def _loop(self, started: threading.Event) -> None:
        started.set()
        while True:
            job = self._jobs.get()
            if job is None:
                return
            try:
                job()
            except BaseException:  # noqa: BLE001, S112 - an interrupt that landed between calls: the thread lives on
                continue
