"""``LocalExecutor``: ranks as worker objects, each on its own daemon thread.

A rank always runs on the same thread (thread-local state in user code, CUDA
current device, torch's per-thread settings stay put), and a call is put on
every rank's queue at once.  Isolation (the default) gives each rank what a
pickle round trip would: every rank copies its arguments on its own thread
(:func:`dispatchcore._isolation.isolated_copy`: tensors cloned, functions
shared), so the copies run in parallel and the driver pays none of them.
"""

from __future__ import annotations

import functools
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
from dispatchcore._isolation import ATOMS, isolated_copy
from dispatchcore._worker_host import first_failure

#: How often a waiting driver checks that rank threads are alive.
_LIVENESS_POLL = 0.5


class _LocalCallHandle(CallHandle):
    def __init__(self, executor: LocalExecutor, call: Call) -> None:
        self._executor = executor
        self._call = call
        self._results: list[Any] = [None] * len(call.ranks)
        self._failures: dict[int, RemoteFailure] = {}
        self._pending = len(call.ranks)
        self._finished = [False] * len(call.ranks)
        self._lock = threading.Lock()
        # A latch: held from creation until the last rank finishes.
        self._latch = threading.Lock()
        self._latch.acquire()
        self._is_done = False
        if not call.ranks:
            self._release()

    def _release(self) -> None:
        self._is_done = True
        self._latch.release()

    def finish(self, position: int, ok: bool, value: Any) -> None:
        with self._lock:
            if ok:
                self._results[position] = value
            else:
                self._failures[position] = value
            self._pending -= 1
            self._finished[position] = True
            if self._pending == 0:
                self._release()

    def done(self) -> bool:
        return self._is_done

    def _wait(self, seconds: float) -> bool:
        if self._is_done:
            return True
        if self._latch.acquire(timeout=seconds):
            self._latch.release()
        return self._is_done

    def result(self, timeout: float | None = None) -> list[Any]:
        deadline = None if timeout is None or self._is_done else time.monotonic() + timeout
        while not self._is_done:
            wait = _LIVENESS_POLL if deadline is None else min(_LIVENESS_POLL, deadline - time.monotonic())
            if wait <= 0 or self._wait(wait):
                if self._is_done:
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
            raise first_failure(self._failures, self._call.ranks)
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
            rank.tasks.put(functools.partial(_run_start, started, position, rank.host))
        try:
            started.result(start_timeout)
        except BaseException:
            self.shutdown()
            raise

    def submit(self, call: Call) -> CallHandle:
        if self._closed:
            raise DispatchError("this local group is shut down")
        handle = _LocalCallHandle(self, call)
        copy_results = self._isolate and not call.results_are_copied
        method = call.method
        if not any(call.args) and not any(call.kwargs):
            for position, rank in enumerate(call.ranks):
                host = self._ranks[rank].host
                self._ranks[rank].tasks.put(functools.partial(_run_plain, handle, position, host, method, copy_results))
            return handle
        isolate = self._isolate
        for position, rank in enumerate(call.ranks):
            host = self._ranks[rank].host
            args, kwargs = call.args[position], call.kwargs[position]

            def task(position: int = position, host: WorkerHost = host, args: Any = args, kwargs: Any = kwargs) -> None:
                try:
                    if isolate:  # each rank copies on its own thread, in parallel
                        args = tuple(isolated_copy(a) for a in args)
                        kwargs = {k: isolated_copy(v) for k, v in kwargs.items()}
                except BaseException as exc:  # noqa: BLE001
                    handle.finish(position, False, RemoteFailure.capture(host.rank, method, exc))
                    return
                handle.finish(position, *_finish(host, method, args, kwargs, copy_results))

            self._ranks[rank].tasks.put(task)
        return handle

    def check_alive(self, call: Call, waiting: list[int]) -> None:
        """Raise :class:`WorkerDiedError` if a rank a call waits on lost its thread."""
        for rank in waiting:
            if not self._ranks[rank].thread.is_alive():
                self.mark_broken(f"rank {rank}'s thread exited")
                raise WorkerDiedError(rank, "its thread is no longer running", call.method)

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


def _finish(
    host: WorkerHost, method: str, args: tuple[Any, ...], kwargs: dict[str, Any], copy_result: bool
) -> tuple[bool, Any]:
    """Run on the rank thread; isolate the result unless collect copies it anyway."""
    ok, value = host.run(method, args, kwargs)
    if ok and copy_result and type(value) not in ATOMS:
        try:
            value = isolated_copy(value)
        except Exception as exc:  # noqa: BLE001
            failure = RemoteFailure.capture(host.rank, method, exc)
            failure.message = f"its result cannot be pickled for isolation ({exc}); return picklable values"
            return False, failure
    return ok, value


def _run_plain(handle: _LocalCallHandle, position: int, host: WorkerHost, method: str, copy: bool) -> None:
    handle.finish(position, *_finish(host, method, (), {}, copy))


def _run_start(handle: _LocalCallHandle, position: int, host: WorkerHost) -> None:
    handle.finish(position, *_start(host))


def _start(host: WorkerHost) -> tuple[bool, Any]:
    failure = host.start()
    return (True, None) if failure is None else (False, failure)
