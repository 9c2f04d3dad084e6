"""``LocalExecutor``: ranks as worker objects, each on its own daemon thread.

A rank always runs on the same thread (thread-local state in user code, CUDA
current device, torch's per-thread settings stay put), and a call is put on
every rank's queue at once.  Isolation (the default) gives each rank what a
pickle round trip would: each distinct argument is pickled once on the
driver (tensors as out-of-band buffers, functions by reference) and every
rank unpickles its own copy on its own thread.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from dispatchcore import (
    Call,
    CallHandle,
    DispatchError,
    Executor,
    GroupSpec,
    RemoteFailure,
    WorkerDiedError,
    WorkerHost,
)
from dispatchcore._executor import timeout_error
from dispatchcore._serialization import Serialized, dumps, loads

_ATOMS = (type(None), bool, int, float, complex, str, bytes)
#: How often a waiting driver checks that rank threads are alive.
_LIVENESS_POLL = 0.5


class _Payload:
    """One distinct argument, ready for any number of ranks to unpack."""

    __slots__ = ("raw", "serialized")

    def __init__(self, value: Any, isolate: bool, method: str) -> None:
        self.raw = value
        self.serialized: Serialized | None = None
        if isolate and not isinstance(value, _ATOMS):
            try:
                self.serialized = dumps(value, share_callables=True)
            except Exception as exc:
                raise DispatchError(
                    f"an argument of {method!r} ({type(value).__name__}) cannot be pickled, and an isolated "
                    f"group hands each rank a pickled copy: {exc}. Make it picklable or create the group "
                    "with isolate=False"
                ) from exc

    def unpack(self) -> Any:
        return self.raw if self.serialized is None else loads(self.serialized, copy=True)


class _LocalCallHandle(CallHandle):
    def __init__(self, executor: LocalExecutor, call: Call) -> None:
        self._executor = executor
        self._call = call
        self._results: list[Any] = [None] * len(call.ranks)
        self._failures: dict[int, RemoteFailure] = {}
        self._pending = len(call.ranks)
        self._finished = [False] * len(call.ranks)
        self._lock = threading.Lock()
        self._done = threading.Event()
        if not call.ranks:
            self._done.set()

    def finish(self, position: int, ok: bool, value: Any) -> None:
        with self._lock:
            if ok:
                self._results[position] = value
            else:
                self._failures[position] = value
            self._pending -= 1
            self._finished[position] = True
            if self._pending == 0:
                self._done.set()

    def done(self) -> bool:
        return self._done.is_set()

    def result(self, timeout: float | None = None) -> list[Any]:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._done.is_set():
            wait = _LIVENESS_POLL if deadline is None else min(_LIVENESS_POLL, deadline - time.monotonic())
            if wait <= 0 or self._done.wait(wait):
                if self._done.is_set():
                    break
                if deadline is not None and time.monotonic() >= deadline:
                    waiting = self._waiting_ranks()
                    self._executor.mark_broken(
                        f"call {self._call.method!r} timed out on rank(s) {waiting}, whose threads may still "
                        "be running it"
                    )
                    raise timeout_error(self._call.method, timeout, waiting)
            self._executor.check_alive(self._call, self._waiting_ranks())
        if self._failures:
            first = min(self._failures)
            error = self._failures[first].to_error()
            others = sorted(self._call.ranks[p] for p in self._failures if p != first)
            if others:
                error.add_note(f"rank(s) {others} raised too")
            raise error
        return self._results

    def _waiting_ranks(self) -> list[int]:
        with self._lock:
            return [r for p, r in enumerate(self._call.ranks) if not self._finished[p]]


class _RankThread:
    """One rank: a worker host and the daemon thread that serves its queue."""

    def __init__(self, host: WorkerHost, name: str) -> None:
        self.host = host
        self.tasks: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._serve, name=name, daemon=True)

    def _serve(self) -> None:
        while True:
            task = self.tasks.get()
            if task is None:
                break
            task()
        self.host.close()


class LocalExecutor(Executor):
    """Backend ``"local"``: zero setup, threads in this process.

    Options: ``start_timeout`` (seconds to wait for every worker's
    ``__init__``, default 300).
    """

    name = "local"

    def __init__(self, spec: GroupSpec) -> None:
        super().__init__(spec)
        self._isolate = spec.isolate
        self._broken: str | None = None
        self._closed = False
        self._ranks = [
            _RankThread(
                WorkerHost(spec.worker_cls, rank, spec.world_size, spec.init_args, dict(spec.init_kwargs)),
                f"dispatchcore-{spec.name}-rank{rank}",
            )
            for rank in range(spec.world_size)
        ]
        start_timeout = float(spec.options.get("start_timeout", 300.0))
        unknown = set(spec.options) - {"start_timeout"}
        if unknown:
            raise TypeError(f"unknown option(s) for the local backend: {sorted(unknown)}; it takes start_timeout")
        started = _LocalCallHandle(
            self, Call("__init__", tuple(range(spec.world_size)), [()] * spec.world_size, [{}] * spec.world_size)
        )
        for position, rank in enumerate(self._ranks):
            rank.thread.start()
            rank.tasks.put(lambda p=position, r=rank: started.finish(p, *_start(r.host)))
        try:
            started.result(start_timeout)
        except BaseException:
            self.shutdown()
            raise

    def submit(self, call: Call) -> CallHandle:
        if self._closed:
            raise DispatchError("this local group is shut down")
        handle = _LocalCallHandle(self, call)
        unique = call.unique_values()
        payloads = [_Payload(v, self._isolate, call.method) for v in unique.values]
        copy_results = self._isolate and not call.results_are_copied
        for position, rank in enumerate(call.ranks):
            thread = self._ranks[rank]

            def task(position: int = position, host: WorkerHost = thread.host) -> None:
                try:
                    if self._isolate:
                        needed = set(unique.arg_slots[position]) | set(unique.kwarg_slots[position].values())
                        resolved = [payloads[i].unpack() if i in needed else None for i in range(len(payloads))]
                        args, kwargs = unique.rebuild(position, resolved)
                    else:
                        args, kwargs = unique.rebuild(position, [p.raw for p in payloads])
                except BaseException as exc:  # noqa: BLE001
                    handle.finish(position, False, RemoteFailure.capture(host.rank, call.method, exc))
                    return
                ok, value = host.run(call.method, args, kwargs)
                if ok and copy_results and not isinstance(value, _ATOMS):
                    try:
                        value = loads(dumps(value, share_callables=True), copy=True)
                    except Exception as exc:  # noqa: BLE001
                        ok, value = False, RemoteFailure.capture(host.rank, call.method, exc)
                        value.message = f"its result cannot be pickled for isolation ({exc}); return picklable values"
                handle.finish(position, ok, value)

            thread.tasks.put(task)
        return handle

    def check_alive(self, call: Call, waiting: list[int]) -> None:
        """Raise :class:`WorkerDiedError` if a rank a call waits on lost its thread."""
        for rank in waiting:
            if not self._ranks[rank].thread.is_alive():
                self.mark_broken(f"rank {rank}'s thread exited")
                raise WorkerDiedError(rank, "its thread is no longer running", call.method)

    def mark_broken(self, reason: str) -> None:
        if self._broken is None:
            self._broken = reason

    @property
    def broken(self) -> str | None:
        return self._broken

    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        for rank in self._ranks:
            rank.tasks.put(None)
        deadline = time.monotonic() + 2.0
        for rank in self._ranks:
            if rank.thread.is_alive() and rank.thread.ident is not None:
                rank.thread.join(max(0.0, deadline - time.monotonic()))


def _start(host: WorkerHost) -> tuple[bool, Any]:
    failure = host.start()
    return (True, None) if failure is None else (False, failure)
