"""The one thread a rank's worker methods run on, whichever way a call arrived.

A call reaches a rank actor on the control lane (every call once the lane
is up) or as a Ray task (start-up, verl's plain calls).  CUDA's current
device and thread-locals are per thread, so both ways run the method here,
where the worker's ``__init__`` ran too.  Lane calls are read
by this thread itself (a selector over its lane links and a wake-up socket),
so a call that arrives on the lane starts without a thread hand-off (about
25 us and a context switch each, measured); Ray tasks queue a job and wake it.
"""

from __future__ import annotations

import queue
import selectors
import socket
import threading
from collections.abc import Callable
from typing import Any

from dispatchcore.executor import LaneLink

Job = Callable[[], None]
#: What to do with each message a watched link delivers, and once it ends.
OnMessage = Callable[[bytearray], None]
OnEnd = Callable[[], None]


class MethodThread:
    """Runs jobs and lane messages one at a time on one thread."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self._waker, self._wakee = socket.socketpair()
        self._waker.setblocking(False)
        self._wakee.setblocking(False)
        self._added: queue.SimpleQueue[tuple[LaneLink, OnMessage, OnEnd]] = queue.SimpleQueue()
        started = threading.Event()
        self._thread = threading.Thread(target=self._loop, args=(started,), name="dispatchcore-methods", daemon=True)
        self._thread.start()
        started.wait()
        #: ``threading.get_ident()`` of the thread (where stacks are read).
        self.ident = self._thread.ident

    def submit(self, job: Job) -> None:
        """Queue ``job`` (it must report its own errors); returns at once."""
        self._jobs.put(job)
        self._wake()

    def watch(self, link: LaneLink, on_message: OnMessage, on_end: OnEnd) -> None:
        """Read ``link`` on this thread from now on: each message to ``on_message``, its end to ``on_end``."""
        self._added.put((link, on_message, on_end))
        self._wake()

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

        self.submit(job)
        done.wait()
        ok, value = box[0]
        if not ok:
            raise value
        return value

    def stop(self) -> None:
        """End the thread after the jobs already queued."""
        self.submit(None)  # type: ignore[arg-type]  # the loop's end marker

    def _wake(self) -> None:
        try:
            self._waker.send(b"\0")
        except (BlockingIOError, OSError):  # already woken (the buffer is full), or stopped
            pass

    # -- the loop ----------------------------------------------------------------
    def _loop(self, started: threading.Event) -> None:
        selector = selectors.DefaultSelector()
        selector.register(self._wakee, selectors.EVENT_READ, None)
        links: list[tuple[LaneLink, OnMessage, OnEnd]] = []
        started.set()
        while True:
            if not self._run_jobs():
                return
            while not self._added.empty():
                watched = self._added.get()
                links.append(watched)
                selector.register(watched[0], selectors.EVENT_READ, watched)
            if any(link.has_ready() for link, _, _ in links):  # read before: no readiness event comes for them
                for watched in links:
                    self._deliver(watched, selector, links)
                continue
            for key, _ in selector.select():
                if key.data is None:
                    try:
                        self._wakee.recv(4096)
                    except BlockingIOError:
                        pass
                else:
                    self._deliver(key.data, selector, links)

    def _run_jobs(self) -> bool:
        """Run the queued jobs; ``False`` at the end marker."""
        while True:
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                return True
            if job is None:
                return False
            _guarded(job)

    @staticmethod
    def _deliver(
        watched: tuple[LaneLink, OnMessage, OnEnd],
        selector: selectors.BaseSelector,
        links: list[tuple[LaneLink, OnMessage, OnEnd]],
    ) -> None:
        link, on_message, on_end = watched
        messages = link.take_ready()
        if messages is None:
            selector.unregister(link)
            links.remove(watched)
            _guarded(on_end)
            return
        for message in messages:
            _guarded(lambda message=message: on_message(message))


def _guarded(job: Job) -> None:
    try:
        job()
    except BaseException:  # noqa: BLE001, S110 - an interrupt that landed between calls: the thread lives on
        pass
