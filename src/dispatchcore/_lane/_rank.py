"""A rank's side of the lane: calls run on the method thread, pings, cancels and stacks answered beside them.

``serve`` runs on the thread that is to run the worker's methods (CUDA's device is per thread).
"""

from __future__ import annotations

import pickle
import queue
import threading
from collections.abc import Callable
from typing import Any

from .._base import DispatchRuntimeError
from .._runtime import RemoteFailure, WorkerHost, cancel_in_process, thread_stacks
from .._trace import TimedResult
from .._wire import dumps
from .._wire._allocator import fill_thread_cache
from ._address import LaneAddress
from ._door import connect_lane
from ._envelope import BulkPath, claimed, inline, is_bulk, open_part, open_values, to_part
from ._link import LaneLink
from ._messages import BESIDE, CANCEL, CONTROL_LINK, DONE, PING, PONG, STACKS, START
from ._rows import row_layout


class LaneRank:
    """One rank's worker and its links to the driver (``serve`` may run again for another driver)."""

    def __init__(
        self,
        rank: int,
        *,
        prepare: Callable[[WorkerHost], None] | None = None,
        bulk: BulkPath | None = None,
        on_driver_gone: Callable[[], None] | None = None,
    ) -> None:
        """``prepare(host)`` runs before the worker's ``__init__`` (set ``host.collective``,
        ``host.tensor_link``...); ``on_driver_gone()`` runs on the control thread when the
        driver's lane ends, even mid-call (a process backend exits there)."""
        self.rank = rank
        self.host: WorkerHost | None = None
        self._prepare = prepare
        self._bulk = bulk
        self._on_driver_gone = on_driver_gone
        self._isolate = True
        self._besides: queue.SimpleQueue[tuple[Any, ...] | None] | None = None

    def serve(self, address: LaneAddress | str, timeout: float = 60.0, *, secret: bytes | None = None) -> None:
        """Connect both links to the driver at ``address`` and run its calls here until it closes the lane.

        ``secret``: the driver's lane secret, as the executor handed it over (``None``: this
        process's :func:`lane_secret`, e.g. set by ``use_lane_secret``).
        """
        if not isinstance(address, LaneAddress):
            address = LaneAddress.decode(address)
        calls = connect_lane(address, self.rank, timeout, secret)
        try:
            control = connect_lane(address, self.rank | CONTROL_LINK, timeout, secret)
        except BaseException:
            calls.close()  # not left for the garbage collector: the driver's door is gone or refused us
            raise
        threading.Thread(
            target=self._serve_control,
            args=(control, threading.get_ident()),
            name="dispatchcore-lane-control",
            daemon=True,
        ).start()
        try:
            while True:
                try:
                    message = calls.recv_object()
                except (ConnectionError, OSError):
                    return
                ok, value = self._start(message) if message[0] == START else self._call(message)
                method = "__init__" if message[0] == START else message[2]
                answer, note = self._answer(message[1], ok, value, method)
                if not _send(calls, answer, note):
                    return
        finally:
            calls.close()
            control.close()

    def _start(self, message: tuple[Any, ...]) -> tuple[bool, Any]:
        _, _, boot, world_size, isolate = message
        try:
            worker_cls, init_args, init_kwargs = open_part(boot)
            if self.host is not None:
                self.host.close()
            host = self.host = WorkerHost(worker_cls, self.rank, world_size, init_args, init_kwargs)
            self._isolate, host.share_kept_rows = isolate, not isolate
            if self._prepare is not None:
                self._prepare(host)
        except BaseException as exc:  # noqa: BLE001 - reported as the rank's __init__ failure
            return False, RemoteFailure.capture(self.rank, "__init__", exc)
        failure = host.start()
        fill_thread_cache()  # after __init__, on the method thread: see keep_freed_memory
        return failure is None, failure

    def _call(self, message: tuple[Any, ...]) -> tuple[bool, Any]:
        _, _, method, instructions, parts, arg_slots, kwarg_slots = message
        try:
            if self.host is None:
                raise DispatchRuntimeError("a call arrived before the worker was built")
            args, kwargs = open_values((parts, arg_slots, kwarg_slots), self._bulk, self._isolate)
        except BaseException as exc:  # noqa: BLE001 - e.g. an argument this rank cannot unpickle
            return False, RemoteFailure.capture(self.rank, method, exc)
        return self.host.run(method, args, kwargs, instructions)

    def _answer(self, cid: int, ok: bool, value: Any, method: str) -> tuple[tuple[Any, ...], bytes]:
        """The DONE message for call ``cid`` and its frame note (``_rows``); an unpicklable result fails the call."""
        if value is None:
            return (DONE, cid, ok, None), b""
        if ok and isinstance(value, TimedResult) and claimed(self._bulk, value.value):
            value = value.value  # handed over as it is (a Ray ObjectRef pickled inside would lose its owner)
        as_is = ok and claimed(self._bulk, value)  # a value only the executor's bulk path can hand over
        if not as_is:
            try:
                pickled = dumps(value)
            except BaseException as exc:  # noqa: BLE001
                failure = RemoteFailure.unpicklable(self.rank, method, "result", exc, in_process=False, value=value)
                return (DONE, cid, False, inline(dumps(failure))), b""
        try:
            part = (None, self._bulk.put(value, ())) if as_is else to_part(pickled, self._bulk)  # type: ignore[union-attr]
        except BaseException as exc:  # noqa: BLE001 - the executor's bulk path failed: so did the call
            return (DONE, cid, False, inline(dumps(RemoteFailure.capture(self.rank, method, exc)))), b""
        if not ok or is_bulk(part):
            return (DONE, cid, ok, part), b""
        # Frame parts: the note, the stream, then the out-of-band buffers (a long inline stream's first).
        first = 2 + isinstance(part[0], pickle.PickleBuffer)
        layout = row_layout(value, pickled.buffers, first)
        return (DONE, cid, ok, part), (cid.to_bytes(8, "little") + layout if layout else b"")

    def _beside(self, control: LaneLink) -> queue.SimpleQueue[tuple[Any, ...] | None]:
        """The queue of the rank's beside thread (started on the first beside call of this lane)."""
        if self._besides is None:
            self._besides = queue.SimpleQueue()
            threading.Thread(
                target=self._serve_beside, args=(control, self._besides), name="dispatchcore-lane-beside", daemon=True
            ).start()
        return self._besides

    def _serve_beside(self, control: LaneLink, besides: queue.SimpleQueue[tuple[Any, ...] | None]) -> None:
        """The core's beside calls (row reads and frees), one at a time, while the method thread runs a call."""
        while (message := besides.get()) is not None:
            ok, value = self._call(message)
            answer, _ = self._answer(message[1], ok, value, message[2])
            if not _send(control, answer):
                return

    def _serve_control(self, control: LaneLink, method_thread: int) -> None:
        """Pings, cancels and stacks, beside whatever call runs; the driver's end when the link ends."""
        while True:
            try:
                message = control.recv_object()
            except (ConnectionError, OSError):
                break
            kind = message[0]
            if kind == PING:
                _send(control, (PONG, message[1]))
            elif kind == CANCEL:
                cancel_in_process(message[1])
            elif kind == STACKS:
                _send(control, (STACKS, message[1], thread_stacks(method_thread, message[2])))
            elif kind == BESIDE:
                self._beside(control).put(message)
        besides, self._besides = self._besides, None  # a later serve (another driver) starts its own
        if besides is not None:
            besides.put(None)
        if self._on_driver_gone is not None:
            self._on_driver_gone()


def _send(link: LaneLink, message: tuple[Any, ...], note: bytes = b"") -> bool:
    """Send ``message``; ``False`` once the driver is gone."""
    try:
        link.send_object(message, note)
    except OSError:
        return False
    return True
