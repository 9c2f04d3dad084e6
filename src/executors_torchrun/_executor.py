"""``TorchrunExecutor``: ranks as torch.distributed processes.

Rank 0 (the driver) is the hub: each call's per-rank arguments are pickled
once per distinct object (``Call.unique_values``), their tensors posted as
gloo sends straight from the caller's memory, and a command pushed on each
rank's store queue.  Ranks answer on their status queues; the hub's reader
threads drain results as they come: into one buffer per tensor key when the
collect step concatenates (see ``_rows``), else into fresh buffers.  Under torchrun,
worker 0 lives in the driver on its own thread; self-started worlds (no
torchrun) put every worker in a child process.
"""

from __future__ import annotations

import threading
import time
import uuid
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

from . import _env
from ._hub import Hub
from ._local_rank import LocalRank
from ._rows import RowPlan
from ._wire import Packed, pack
from ._worlds import SpawnedWorld, torchrun_hub

_OPTIONS = ("start_timeout", "ranks", "transport_timeout")
#: How often a waiting caller checks worker 0's thread.
_POLL_S = 0.5


class _Handle(CallHandle):
    """One call's per-rank answers; filled by reader threads and worker 0's thread."""

    def __init__(
        self, executor: TorchrunExecutor, method: str, ranks: tuple[int, ...], place_rows: bool = False
    ) -> None:
        self._executor = executor
        #: Set when the collect step concatenates: results land in shared row buffers.
        self.rows = RowPlan(len(ranks)) if place_rows else None
        self._method = method
        self._ranks = ranks
        self._results: list[Any] = [None] * len(ranks)
        self._failures: dict[int, RemoteFailure] = {}
        self._deaths: dict[int, str] = {}
        self._finished = [False] * len(ranks)
        self._pending = len(ranks)
        self._lock = threading.Lock()
        self._event = threading.Event()
        if not ranks:
            self._event.set()

    def sink(self, position: int) -> _Sink:
        return _Sink(self, position)

    def finish(self, position: int, ok: bool, value: Any, died: str | None = None) -> None:
        with self._lock:
            if self._finished[position]:
                return
            self._finished[position] = True
            if died is not None:
                self._deaths[position] = died
            elif ok:
                self._results[position] = value
            else:
                if isinstance(value, RemoteFailure) and value.rank < 0:
                    value.rank = self._ranks[position]
                self._failures[position] = value
            self._pending -= 1
            if self._pending == 0:
                self._event.set()

    def done(self) -> bool:
        return self._event.is_set()

    def result(self, timeout: float | None = None) -> list[Any]:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._event.is_set():
            wait = _POLL_S if deadline is None else min(_POLL_S, deadline - time.monotonic())
            if wait > 0 and self._event.wait(wait):
                break
            if deadline is not None and time.monotonic() >= deadline:
                waiting = self._waiting()
                self._executor.mark_broken(
                    f"call {self._method!r} timed out on rank(s) {waiting}, which may still be running it"
                )
                raise timeout_error(self._method, timeout, waiting)
            self._executor.check_local(self)
        if self._deaths:
            position = min(self._deaths)
            rank = self._ranks[position]
            self._executor.mark_broken(f"rank {rank} died")
            raise WorkerDiedError(rank, self._deaths[position], self._method)
        if self._failures:
            raise first_failure(self._failures, self._ranks)
        return self._results

    def _waiting(self) -> list[int]:
        with self._lock:
            return [r for p, r in enumerate(self._ranks) if not self._finished[p]]

    def local_position(self, rank: int) -> int | None:
        return self._ranks.index(rank) if rank in self._ranks and not self._finished[self._ranks.index(rank)] else None


class _Sink:
    __slots__ = ("handle", "position")

    def __init__(self, handle: _Handle, position: int) -> None:
        self.handle = handle
        self.position = position

    def deliver(self, ok: bool, value: Any) -> None:
        self.handle.finish(self.position, ok, value)

    def died(self, detail: str) -> None:
        self.handle.finish(self.position, False, None, died=detail)

    def targets(self, layout: Any) -> tuple[dict[int, Any], dict[str, Any]] | None:
        rows = self.handle.rows
        return None if rows is None else rows.targets(self.position, layout)


class TorchrunExecutor(Executor):
    """Backend ``"torchrun"``: ``torchrun --nproc-per-node=N driver.py``, or self-started ranks.

    Options: ``ranks`` (world ranks hosting this group, under torchrun;
    default ``0..world_size-1``), ``start_timeout`` (seconds for the ranks to
    come up and build their workers, default 120), ``transport_timeout``
    (bound on one tensor transfer, default 1800).
    """

    name = "torchrun"
    extra = "torchrun"
    requires = ("cloudpickle",)

    @classmethod
    def launch_world_size(cls) -> int | None:
        return _env.torchrun_world_size()

    def __init__(self, spec: GroupSpec) -> None:
        super().__init__(spec)
        options = dict(spec.options)
        unknown = sorted(set(options) - set(_OPTIONS))
        if unknown:
            raise TypeError(f"unknown option(s) for the torchrun backend: {unknown}; it takes {list(_OPTIONS)}")
        start_timeout = float(options.get("start_timeout", 120.0))
        transport_timeout = float(options.get("transport_timeout", 1800.0))
        self._isolate = spec.isolate

        self._closed = False
        self._gid = f"{spec.name}#{uuid.uuid4().hex[:8]}"
        self._local: LocalRank | None = None
        self._world: SpawnedWorld | None = None
        self._submit_lock = threading.Lock()
        ranks = _check_ranks(options.get("ranks"), spec.world_size)
        if _env.under_torchrun():
            size = int(_env.torchrun_world_size() or 0)
            self._hub: Hub = torchrun_hub(
                start_timeout=start_timeout, transport_timeout=transport_timeout, death_timeout=spec.death_timeout
            )
            if max(ranks) >= size:
                raise ValueError(f"ranks {ranks} do not fit this torchrun launch of {size} processes")
            self._data_ranks = list(ranks)
        else:
            self._world = SpawnedWorld(
                spec.world_size,
                start_timeout=start_timeout,
                transport_timeout=transport_timeout,
                death_timeout=spec.death_timeout,
            )
            self._hub = self._world.hub
            self._data_ranks = [self._world.data_rank(g) for g in range(spec.world_size)]
        try:
            self._start(start_timeout)
        except BaseException:
            self.shutdown()
            raise

    # -- start ----------------------------------------------------------------------
    def _start(self, timeout: float) -> None:
        spec = self.spec
        handle = _Handle(self, "__init__", tuple(range(spec.world_size)))
        remote = [g for g, d in enumerate(self._data_ranks) if d != 0]
        if len(remote) < spec.world_size:
            host = WorkerHost(
                spec.worker_cls, self._data_ranks.index(0), spec.world_size, spec.init_args, dict(spec.init_kwargs)
            )
            self._local = LocalRank(host, f"dispatchcore-{spec.name}-rank0")
            position = self._data_ranks.index(0)
            self._local.put(lambda: handle.finish(position, *_started(host)))
        if remote:
            packed = _pack_or_explain((spec.worker_cls, tuple(spec.init_args), dict(spec.init_kwargs)), "__init__")
            with self._submit_lock:
                for g in remote:
                    d = self._data_ranks[g]
                    first = self._hub.send_value(packed, d)
                    cid = self._hub.next_cid()
                    message = ("start", cid, self._gid, g, spec.world_size, packed.header, first)
                    self._hub.command(d, message, handle.sink(g), cid)
        handle.result(timeout)

    # -- calls ------------------------------------------------------------------------
    def submit(self, call: Call) -> CallHandle:
        if self._closed:
            raise DispatchError("this torchrun group is shut down")
        handle = _Handle(self, call.method, call.ranks, place_rows=call.results_are_copied)
        unique = call.unique_values()
        remote = [(p, self._data_ranks[g]) for p, g in enumerate(call.ranks) if self._data_ranks[g] != 0]
        local = [p for p, g in enumerate(call.ranks) if self._data_ranks[g] == 0]
        needed = [
            sorted(set(unique.arg_slots[p]) | set(unique.kwarg_slots[p].values())) for p in range(len(call.ranks))
        ]
        packed: dict[int, Packed] = {}
        for p, _ in remote:
            for slot in needed[p]:
                if slot not in packed:
                    packed[slot] = _pack_or_explain(unique.values[slot], call.method)
        with self._submit_lock:
            for p, d in remote:
                values = [(slot, packed[slot].header, self._hub.send_value(packed[slot], d)) for slot in needed[p]]
                cid = self._hub.next_cid()
                message = ("call", cid, self._gid, call.method, values, unique.arg_slots[p], unique.kwarg_slots[p])
                self._hub.command(d, message, handle.sink(p), cid)
        for p in local:
            self._run_local(call, handle, p, unique, needed[p])
        return handle

    def _run_local(self, call: Call, handle: _Handle, position: int, unique: Any, slots: list[int]) -> None:
        """Queue worker 0's part; with isolation it gets a private copy (what a remote rank would get).

        The copies are the core's :func:`~dispatchcore._isolation.isolated_copy`, made on worker 0's
        own thread, as the local executor does.
        """
        assert self._local is not None
        host = self._local.host
        copy = isolated_copy if self._isolate else (lambda value: value)
        copy_result = self._isolate and not call.results_are_copied

        def task() -> None:
            try:
                resolved: list[Any] = [None] * len(unique.values)
                for slot in slots:
                    resolved[slot] = copy(unique.values[slot])
                args, kwargs = unique.rebuild(position, resolved)
            except BaseException as exc:  # noqa: BLE001
                handle.finish(position, False, RemoteFailure.capture(host.rank, call.method, exc))
                return
            ok, value = host.run(call.method, args, kwargs)
            if ok and copy_result and type(value) not in ATOMS:
                try:
                    value = isolated_copy(value)
                except Exception as exc:  # noqa: BLE001
                    ok, value = False, RemoteFailure.capture(host.rank, call.method, exc)
                    value.message = f"its result cannot be pickled for isolation ({exc}); return picklable values"
            handle.finish(position, ok, value)

        self._local.put(task)

    def check_local(self, handle: _Handle) -> None:
        """Fail a call whose worker-0 thread is gone (it can only die with the driver's help)."""
        if self._local is not None and not self._local.thread.is_alive():
            position = handle.local_position(self._local.host.rank)
            if position is not None:
                handle.finish(position, False, None, died="worker 0's thread is no longer running")

    # -- shutdown ----------------------------------------------------------------------
    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        stuck = self._broken is not None
        if self._world is not None:
            self._world.stop(wait=0.5 if stuck else 10.0)
        elif not self._hub.closed:
            for d in set(self._data_ranks) - {0}:
                self._hub.command(d, ("close", self._gid))
        if self._local is not None:
            self._local.stop(0.0 if stuck else 2.0)


def _check_ranks(ranks: Any, world_size: int) -> list[int]:
    if ranks is None:
        return list(range(world_size))
    if isinstance(ranks, (str, bytes)) or not hasattr(ranks, "__iter__"):
        raise TypeError(f"ranks must be a list of ints, got {ranks!r}")
    out = list(ranks)
    if any(isinstance(r, bool) or not isinstance(r, int) or r < 0 for r in out) or len(set(out)) != len(out):
        raise ValueError(f"ranks must be distinct ints >= 0, got {ranks!r}")
    if len(out) != world_size:
        raise ValueError(
            f"ranks {out} name {len(out)} processes but world_size is {world_size}; pass world_size=len(ranks)"
        )
    return out


def _started(host: WorkerHost) -> tuple[bool, Any]:
    failure = host.start()
    return (True, None) if failure is None else (False, failure)


def _pack_or_explain(value: Any, method: str) -> Packed:
    try:
        return pack(value)
    except Exception as exc:
        raise DispatchError(
            f"an argument of {method!r} ({type(value).__name__}) cannot be pickled, and torchrun ranks are "
            f"separate processes: {exc}"
        ) from exc
