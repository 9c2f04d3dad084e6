"""A rank actor's end of the control lane: two links per driver, calls read by the method thread itself.

Each driver that joins the actor gets two links: the *call* link, which the
method thread reads between calls (so a call starts on the thread that runs
it, with no hand-off), and the *control* link, read by a thread of its own
that never runs worker code, so pings, cancels and stash failures are
answered while a call runs.

Driver to rank (objects framed by ``LaneLink.send_object``)::

    ("call", cid, method, layout, values, stash)  (call link) run ``method``; ``values`` are the layout's top-level
                                                 values, or ``None`` with ``stash`` naming the Ray task
                                                 that brings them (values holding object references)
    ("unstash", stash, message)                  (control link) that task failed: the call fails with it
    ("cancel", call_id)                          (control link) ``cancel_in_process``, beside the running call
    ("ping", n)                                  (control link) answered at once, even mid-call

Rank to driver::

    ("done", cid, result)                        what ``RankActor._run`` returns
    ("kept", cid, key)                           a result that is an object reference, or larger than
                                                 the lane's inline bound: the driver takes it with
                                                 ``take_result(key)``, a Ray task (a reference only Ray
                                                 can hand over; a large payload goes by the object store)
    ("pong", n)                                  (control link)

A link that ends (the driver exited, or let a detached group go) is just
dropped: the worker lives on, and another driver may join.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from dispatchcore.executor import LaneAddress, LaneLink, RemoteFailure, cancel_in_process, connect_lane, unframe_object

from ._method_thread import MethodThread
from ._payload import packed_nbytes
from ._tags import CONTROL_LINK, FAILED, OK_PACKED, Layout

#: Runs one call (``RankActor._run``): ``(method, layout, values, isolate) -> result``.
RunCall = Callable[[str, Layout, tuple[Any, ...], bool], Any]


class _Stash:
    """A call's values arriving by a Ray task (they hold object references Ray must resolve)."""

    def __init__(self) -> None:
        self.arrived = threading.Event()
        self.values: tuple[Any, ...] = ()
        self.failure: str | None = None


class RankLane:
    """Every lane link of one rank actor (a detached group's actors may serve several drivers in turn)."""

    def __init__(self, run_call: RunCall, methods: MethodThread) -> None:
        self._run_call = run_call
        self._methods = methods
        self._lock = threading.Lock()
        self._stashes: dict[Any, _Stash] = {}
        self._kept: dict[Any, Any] = {}
        self.rank = -1
        #: The group's ``isolate``: values that came through the object store (a stash) are copied.
        self.isolate = True
        #: Results larger than this many bytes are kept for the driver to take through the object store.
        self.inline_max = 8 << 20

    def join(self, address: str, rank: int, timeout: float, inline_max: int) -> None:
        """Connect both links to the driver's door as ``rank``; the method thread reads the call link."""
        door = LaneAddress.decode(address)
        calls = connect_lane(door, rank, timeout)
        control = connect_lane(door, rank | CONTROL_LINK, timeout)
        self.rank, self.inline_max = rank, inline_max
        closed = threading.Event()

        def on_end() -> None:
            closed.set()
            calls.close()
            control.close()

        self._methods.watch(calls, lambda raw: self.run(calls, closed, unframe_object(raw)), on_end)
        threading.Thread(
            target=self._serve_control, args=(control, closed), name="dispatchcore-lane-control", daemon=True
        ).start()

    def stash(self, key: Any, values: tuple[Any, ...]) -> None:
        """The values of call ``key`` (from its Ray task, run in the actor's ``rows`` group)."""
        entry = self._stash_entry(key)
        entry.values = values
        entry.arrived.set()

    def take_result(self, key: Any) -> Any:
        """A kept result (see ``("kept", ...)``), handed over once."""
        with self._lock:
            return self._kept.pop(key)

    def _stash_entry(self, key: Any) -> _Stash:
        with self._lock:
            entry = self._stashes.get(key)
            if entry is None:
                entry = self._stashes[key] = _Stash()
            return entry

    def _serve_control(self, link: LaneLink, closed: threading.Event) -> None:
        """Pings, cancels and stash failures, beside whatever call runs."""
        while True:
            try:
                message = link.recv_object()
            except (ConnectionError, OSError):
                break
            kind = message[0]
            if kind == "ping":
                _send(link, ("pong", message[1]))
            elif kind == "cancel":
                cancel_in_process(message[1])
            elif kind == "unstash":
                entry = self._stash_entry(message[1])
                entry.failure = message[2]
                entry.arrived.set()
        closed.set()

    def take_stash(self, key: Any, closed: threading.Event) -> tuple[tuple[Any, ...] | None, str | None]:
        """Wait for call ``key``'s values: ``(values, None)``, or ``(None, why not)``."""
        entry = self._stash_entry(key)
        while not entry.arrived.wait(0.5):
            if closed.is_set():
                break
        with self._lock:
            self._stashes.pop(key, None)
        if not entry.arrived.is_set():
            return None, "the driver's lane closed before the call's arguments arrived"
        if entry.failure is not None:
            return None, entry.failure
        return entry.values, None

    def run(self, link: LaneLink, closed: threading.Event, message: tuple[Any, ...]) -> None:
        """One call from ``link``, on the method thread; its answer goes back on the same link."""
        try:
            self._run(link, closed, message)
        except BaseException as exc:  # noqa: BLE001 - every call gets an answer, or the driver would wait on it
            failure = RemoteFailure.capture(self.rank, message[2], exc)
            _send(link, ("done", message[1], (FAILED, failure)))

    def _run(self, link: LaneLink, closed: threading.Event, message: tuple[Any, ...]) -> None:
        _, cid, method, layout, values, stash = message
        if stash is not None:
            values, why = self.take_stash(stash, closed)
            if values is None:
                failure = RemoteFailure(
                    self.rank, method, "RuntimeError", f"the call's arguments never arrived: {why}", ""
                )
                _send(link, ("done", cid, (FAILED, failure)))
                return
        # The lane's values are this process's own memory (unframed into a fresh buffer): no copy for isolation.
        result = self._run_call(method, layout, values, stash is not None and self.isolate)
        if self._keep(result):
            key = (id(link), cid)
            with self._lock:
                self._kept[key] = result
            _send(link, ("kept", cid, key))
            return
        _send(link, ("done", cid, result))

    def _keep(self, result: Any) -> bool:
        """Whether ``result`` goes by the object store: a reference (e.g. a weight bucket put by the worker),
        or a payload past the inline bound."""
        if type(result).__name__ == "ObjectRef":
            return True
        if type(result) is tuple and len(result) == 2 and result[0] == OK_PACKED:
            return packed_nbytes(result[1]) > self.inline_max
        return False


def _send(link: LaneLink, message: tuple[Any, ...]) -> None:
    try:
        link.send_object(message)
    except OSError:  # the driver is gone: nobody waits for the answer
        pass
