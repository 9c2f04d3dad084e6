"""``MultiprocessExecutor``: one spawned process per rank, a pipe to each.

Written only against the public executor contract (:mod:`dispatchcore.executor`
and :mod:`dispatchcore.wire`).  What is specific to this backend:

* how ranks start: ``multiprocessing`` processes (start method ``spawn``),
  each given torchrun's variables from :func:`rank_environment`;
* how bytes move: :mod:`._pipe` frames over a duplex pipe per rank; one
  reader thread per rank delivers results into the call's handle;
* how death is seen: the pipe reaches EOF (the reader reports every call
  still pending on that rank) or the process is no longer alive
  (:meth:`RankCallHandle.check_alive`, polled by the handle).

:class:`RankCallHandle` owns every time bound; isolation holds by
construction, since each rank unpickles its own bytes.
"""

from __future__ import annotations

import atexit
import itertools
import multiprocessing
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Any

from dispatchcore import DispatchError, wire
from dispatchcore.executor import (
    COLLECTIVE_STORE_ENV,
    LOOPBACK,
    Call,
    Executor,
    GroupSpec,
    RankCallHandle,
    RemoteFailure,
    StoreCollective,
    check_options,
    free_port,
    rank_environment,
    unpicklable_error,
    unpicklable_spec_error,
)

from . import _pipe
from ._rank import CANCEL, RUN, STACKS, START, rank_main

_DEFAULTS: dict[str, Any] = {"start_timeout": 300.0, "env": None}
#: Seconds a rank gets to leave after each of: the stop message, SIGTERM, SIGKILL.
STOP_GRACE_S = 1.0
#: Message = (parts, positional slots, keyword slots) for one position of a call.
_Message = tuple[list[wire.Serialized], tuple[int, ...], dict[str, int]]


@dataclass
class _Rank:
    proc: BaseProcess
    conn: Connection
    send_lock: threading.Lock = field(default_factory=threading.Lock)
    #: call id -> (handle, position in the call), for calls this rank has not answered.
    pending: dict[int, tuple[RankCallHandle, int]] = field(default_factory=dict)
    #: How the rank was seen to go, once it has.
    gone: str | None = None
    reader: threading.Thread | None = None


class _MpCallHandle(RankCallHandle):
    def __init__(self, executor: MultiprocessExecutor, call: Call) -> None:
        super().__init__(call, death_timeout=executor.spec.death_timeout, on_broken=executor.mark_broken)
        self._executor = executor

    def check_alive(self, waiting: list[int]) -> None:
        for position in waiting:
            detail = self._executor.exit_detail(self.call.ranks[position])
            if detail is not None:
                self.rank_died(position, detail)


class MultiprocessExecutor(Executor):
    """Backend ``"multiprocess"``: one spawned process per rank on this machine.

    Options: ``start_timeout`` (seconds to wait for every worker's
    ``__init__``, default 300), ``env`` (extra environment variables for
    every rank).
    """

    name = "multiprocess"
    requires = ("cloudpickle",)  # driver-defined classes and lambdas travel by value

    def __init__(self, spec: GroupSpec) -> None:
        super().__init__(spec)
        options = check_options(self.name, spec.options, _DEFAULTS)
        self._lock = threading.Lock()  # guards _closed, every _Rank's pending/gone, and process polls
        self._closed = False
        self._ids = itertools.count()
        self._ranks: list[_Rank] = []
        self._options = options
        #: Ranks of processes that were replaced (reaped at shutdown with the rest).
        self._retired: list[_Rank] = []
        #: dispatchcore.collective's store: held here, so it outlives a replaced rank; a port of its own.
        self._collective: tuple[Any, str] | None = None
        #: The worker class and init arguments as every rank gets them: pickled before any process
        #: starts, so one that cannot be pickled is refused with nothing started or sent.
        self._boot = _pickle_spec(spec)
        atexit.register(self.shutdown)  # before multiprocessing's own exit hook joins the ranks
        try:
            self._collective = StoreCollective.serve(LOOPBACK)
            port = free_port(LOOPBACK)
            self._ranks = [self._spawn(rank, port) for rank in range(spec.world_size)]
            self._start_workers(tuple(range(spec.world_size)))
        except BaseException:
            self.shutdown()
            raise

    def _start_workers(self, ranks: tuple[int, ...]) -> None:
        """Build the worker on ``ranks`` (its ``__init__``), bounded by ``start_timeout``."""
        boot = self._boot
        started = self._send(
            Call("__init__", ranks, [()] * len(ranks), [{}] * len(ranks)), START, lambda p: ([boot], (), {})
        )
        started.result(float(self._options["start_timeout"]))

    def _spawn(self, rank: int, port: int) -> _Rank:
        ctx = multiprocessing.get_context("spawn")
        size = self.spec.world_size
        env = rank_environment(rank, size, master_addr=LOOPBACK, master_port=port, extra=self._options["env"])
        if self._collective is not None:
            env[COLLECTIVE_STORE_ENV] = self._collective[1]
        ours, theirs = ctx.Pipe(duplex=True)
        proc = ctx.Process(
            target=rank_main, args=(theirs, rank, size, env), name=f"dispatchcore-{self.spec.name}-rank{rank}"
        )
        try:
            proc.start()
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()  # the child has its own copy; ours must go for EOF to mean "gone"
        state = _Rank(proc, ours)
        state.reader = threading.Thread(target=self._read, args=(state,), name=f"{proc.name}-reader", daemon=True)
        state.reader.start()
        return state

    def replace_ranks(self, ranks: Sequence[int]) -> dict[str, str]:
        """A new process for each of ``ranks`` (the old one killed first), with a fresh rendezvous port."""
        if self._closed:
            raise DispatchError("this multiprocess group is shut down")
        port = free_port(LOOPBACK)
        for rank in ranks:
            old = self._ranks[rank]
            if old.proc.is_alive():
                old.proc.kill()
            self._retired.append(old)
            self._ranks[rank] = self._spawn(rank, port)
        self._start_workers(tuple(ranks))
        return {"MASTER_ADDR": LOOPBACK, "MASTER_PORT": str(port)}

    # -- calls ---------------------------------------------------------------
    def submit(self, call: Call) -> RankCallHandle:
        if self._closed:
            raise DispatchError("this multiprocess group is shut down")
        unique = call.unique_values()  # an object sent to several ranks is pickled once
        parts = [_pickle_argument(value, call.method) for value in unique.values]  # all before the first send

        def message(position: int) -> _Message:
            used = sorted({*unique.arg_slots[position], *unique.kwarg_slots[position].values()})
            index = {slot: i for i, slot in enumerate(used)}
            args = tuple(index[s] for s in unique.arg_slots[position])
            kwargs = {k: index[s] for k, s in unique.kwarg_slots[position].items()}
            return [parts[s] for s in used], args, kwargs

        return self._send(call, RUN, message)

    def _send(self, call: Call, kind: str, message: Callable[[int], _Message]) -> RankCallHandle:
        handle = _MpCallHandle(self, call)
        call_id = next(self._ids)
        for position, rank in enumerate(call.ranks):
            state = self._ranks[rank]
            with self._lock:  # registered before sending: the answer may come back at once
                gone = state.gone
                if gone is None:
                    state.pending[call_id] = (handle, position)
            if gone is not None:
                handle.rank_died(position, gone)
                continue
            parts, arg_slots, kwarg_slots = message(position)
            header = (call_id, kind, call.method, call.instructions, arg_slots, kwarg_slots)
            try:
                with state.send_lock:
                    _pipe.send(state.conn, header, parts)
            except OSError as exc:
                with self._lock:
                    state.pending.pop(call_id, None)
                handle.rank_died(position, f"its pipe broke ({exc})")
        return handle

    def _read(self, state: _Rank) -> None:
        """Deliver this rank's answers until its pipe closes, then report what is left as dead."""
        while True:
            try:
                (call_id, ok), parts = _pipe.recv(state.conn)
            except (EOFError, OSError):
                break
            with self._lock:
                handle, position = state.pending.pop(call_id, (None, 0))
            if handle is None:
                continue
            try:
                value = _pipe.decode(parts[0])
            except BaseException as exc:  # noqa: BLE001 - e.g. a result class the driver cannot import
                ok, value = False, RemoteFailure.capture(handle.call.ranks[position], handle.call.method, exc)
            handle.deliver(position, ok, value)
        wait([state.proc.sentinel], 1.0)  # the pipe closes as the process ends: let it finish
        with self._lock:
            state.gone = "the group was shut down" if self._closed else _exited(state.proc)
            pending, state.pending = state.pending, {}
        for handle, position in pending.values():
            handle.rank_died(position, state.gone)

    def exit_detail(self, rank: int) -> str | None:
        """``None`` while ``rank``'s process runs, else how it went."""
        state = self._ranks[rank]
        with self._lock:
            if state.gone is not None or self._closed:
                return state.gone or "the group was shut down"
            if state.proc.is_alive():
                return None
        if state.reader is not None:
            state.reader.join(1.0)  # deliver what the rank sent before it went
        with self._lock:
            return state.gone or ("the group was shut down" if self._closed else _exited(state.proc))

    # -- where each rank is ----------------------------------------------------
    def rank_stacks(self, ranks: Sequence[int], all_threads: bool, timeout: float) -> dict[int, str]:
        """Each rank's reader thread answers at once with its main thread's stack, beside a running call."""
        if self._closed:
            return {}
        flag = wire.dumps(all_threads)
        handles = {
            rank: self._send(Call("_stacks", (rank,), [()], [{}]), STACKS, lambda p: ([flag], (), {})) for rank in ranks
        }
        deadline = time.monotonic() + timeout
        out: dict[int, str] = {}
        for rank, handle in handles.items():
            try:
                out[rank] = handle.result(max(0.0, deadline - time.monotonic()))[0]
            except Exception:  # noqa: BLE001, S112 - no answer in time (or the rank is gone): left out
                continue
        return out

    # -- stopping a call -------------------------------------------------------
    def cancel_call(self, call: Call, ranks: Sequence[int]) -> bool:
        """Each rank's reader thread stops the call at once, beside it (nothing is waited for)."""
        if self._closed:
            return False
        header: tuple[Any, ...] = (-1, CANCEL, call.method, call.instructions, (), {})
        for rank in ranks:
            state = self._ranks[rank]
            try:
                with state.send_lock:
                    _pipe.send(state.conn, header, [])
            except OSError:  # the rank is gone: its reader reports the call's end
                continue
        return True

    def can_replace_ranks(self) -> bool:
        """Any rank can be restarted (the old process killed) until the group is shut down."""
        return not self._closed

    # -- shutdown ------------------------------------------------------------
    def shutdown(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        atexit.unregister(self.shutdown)
        self._collective = None
        for state in self._ranks:  # ask each rank to leave after the calls it has queued
            try:
                with state.send_lock:
                    _pipe.send(state.conn, None, [])
            except OSError:
                pass
        everyone = self._ranks + self._retired
        for stop in (None, "terminate", "kill"):
            if stop is not None:
                with self._lock:
                    for state in everyone:
                        if state.proc.is_alive():
                            getattr(state.proc, stop)()
            if self._all_exited(everyone, STOP_GRACE_S):
                break
        for state in everyone:
            if state.reader is not None:
                state.reader.join(STOP_GRACE_S)
            with self._lock:
                # Its pipe closes a moment before the process can be reaped: wait for that,
                # or close() is skipped and its two pipe descriptors stay open.
                state.proc.join(STOP_GRACE_S)
                if state.proc.exitcode is not None:
                    state.proc.close()
            state.conn.close()

    def _all_exited(self, ranks: list[_Rank], seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        sentinels = [state.proc.sentinel for state in ranks if state.proc.exitcode is None]
        while sentinels and (left := deadline - time.monotonic()) > 0:
            for ready in wait(sentinels, left):
                sentinels.remove(ready)  # type: ignore[arg-type]
        return not sentinels


def _exited(proc: BaseProcess) -> str:
    code = proc.exitcode
    return "its process is no longer running" if code is None else f"its process exited with code {code}"


def _pickle_spec(spec: GroupSpec) -> wire.Serialized:
    """The worker class and init arguments, pickled; the core's one error naming what cannot be."""
    try:
        return wire.dumps((spec.worker_cls, tuple(spec.init_args), dict(spec.init_kwargs)))
    except Exception as exc:
        raise unpicklable_spec_error(spec, exc) from exc


def _pickle_argument(value: Any, method: str) -> wire.Serialized:
    """One argument, pickled; the core's one error (it names the argument and the path to the culprit)."""
    try:
        return wire.dumps(value)
    except Exception as exc:
        raise unpicklable_error(method, value, exc) from exc
