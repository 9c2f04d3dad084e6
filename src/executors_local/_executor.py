"""``LocalExecutor``: ranks as worker objects, each on its own daemon thread, built from the public contract.

Small arguments are copied on the driver, larger ones on each rank's thread; ``os._exit`` in a worker
ends the driver's process too (plant deaths with the ``faulty`` backend).
"""

from __future__ import annotations

import functools
import os
import time
import weakref
from collections.abc import Sequence
from typing import Any

import torch

from dispatchcore import DataProto, DispatchError
from dispatchcore.executor import (
    ATOMS,
    Call,
    Executor,
    GroupSpec,
    Instructions,
    Operation,
    RankCallHandle,
    RankThread,
    ThreadCollective,
    WorkerHost,
    cancel_in_process,
    check_copyable,
    check_options,
    check_spec_picklable,
    isolated_copy,
    run_isolated,
    thread_stacks,
    unpicklable_error,
)

from ._transfer import LINK

_DEFAULTS = {"start_timeout": 300.0}
#: Calls whose arguments hold at most this many bytes (all ranks together) are copied on the driver.
#: Measured on 2 cores (8 KB .. 1 MB DP echo, N=2 and 4): the driver copy is as fast or faster up to
#: 512 KB; above, ranks copying in parallel win.
DRIVER_COPY_BYTES = 256 << 10


class _LocalCallHandle(RankCallHandle):
    def __init__(self, executor: LocalExecutor, call: Call) -> None:
        super().__init__(call, death_timeout=executor.spec.death_timeout, on_broken=executor.mark_broken)
        self._threads = executor.rank_threads

    def check_alive(self, waiting: list[int]) -> None:
        for position in waiting:
            if not self._threads[self.call.ranks[position]].is_alive():
                self.rank_died(position, "its thread is no longer running")


class LocalExecutor(Executor):
    """Backend ``"local"``: zero setup, threads in this process; option ``start_timeout`` (s, default 300)."""

    name = "local"
    ranks_share_process = True

    def __init__(self, spec: GroupSpec) -> None:
        super().__init__(spec)
        options = check_options(self.name, spec.options, _DEFAULTS)
        if spec.isolate:  # refused as a process backend would refuse it; isolate=False shares it uncopied
            check_spec_picklable(spec)
        self._closed = False
        #: Calls not known to be finished (see ``shutdown``).
        self._calls: weakref.WeakSet[RankCallHandle] = weakref.WeakSet()
        self._start_timeout = float(options["start_timeout"])
        self.rank_threads: list[RankThread] = []
        try:
            self._start_ranks(range(spec.world_size))
        except BaseException:
            self.shutdown()
            raise

    def _start_ranks(self, ranks: range) -> None:
        """Threads and workers for ``ranks`` (the next numbers), all ranks meeting in one collective of the new size."""
        spec = self.spec
        self.rank_threads += [
            RankThread(
                WorkerHost(spec.worker_cls, rank, spec.world_size, spec.init_args, dict(spec.init_kwargs)),
                f"dispatchcore-{spec.name}-rank{rank}",
            )
            for rank in ranks
        ]
        self._relink()
        started = _LocalCallHandle(self, Call("__init__", tuple(ranks), [()] * len(ranks), [{}] * len(ranks)))
        for position, rank in enumerate(ranks):
            host = self.rank_threads[rank].host
            host.share_kept_rows = not spec.isolate  # isolate=False: lazy rows read in place
            host.tensor_link = LINK  # weight transfers: views handed over in this process
            self.rank_threads[rank].put(functools.partial(_start, started, position, host))
        started.result(self._start_timeout)

    def _relink(self) -> None:
        """One collective per group and size: its rank threads meet in it (a host relinks at its next method)."""
        collective = ThreadCollective(self.name, len(self.rank_threads))
        for rank in self.rank_threads:
            rank.host.collective = collective

    def add_ranks(self, count: int) -> dict[str, str]:
        """New rank threads, their workers built at the new size (the rest take it at the resize's rejoin)."""
        if self._closed:
            raise DispatchError("this local group is shut down")
        n = self.spec.world_size
        self.resize_spec(n + count)
        try:
            self._start_ranks(range(n, n + count))
        except BaseException:
            self._stop(self.rank_threads[n:], 2.0)
            del self.rank_threads[n:]
            self.resize_spec(n)
            self._relink()
            raise
        return {}

    def remove_ranks(self, ranks: Sequence[int]) -> dict[str, str]:
        """Stop ``ranks``' threads (idle: their calls are over); the others move down to ``0..n-1``."""
        if self._closed:
            raise DispatchError("this local group is shut down")
        gone = set(ranks)
        self._stop([t for r, t in enumerate(self.rank_threads) if r in gone], 2.0)
        self.rank_threads = [t for r, t in enumerate(self.rank_threads) if r not in gone]
        self.resize_spec(len(self.rank_threads))
        self._relink()
        return {}

    def submit(self, call: Call) -> RankCallHandle:
        if self._closed:
            raise DispatchError("this local group is shut down")
        # A transfer step's arguments are the core's own frozen records (buckets, wants): nothing to isolate.
        isolate = self.spec.isolate and call.instructions.operation is not Operation.TRANSFER
        copy_result = isolate and not call.results_are_copied
        method, instructions, threads = call.method, call.instructions, self.rank_threads
        bare = not any(call.args) and not any(call.kwargs)
        copy_here = isolate and not bare and _small_arguments(call)
        # Copied (or checked, for the ranks to copy) before anything is queued: no rank starts a refused call.
        if copy_here:
            per_rank = [
                _copy_arguments(method, args, kwargs) for args, kwargs in zip(call.args, call.kwargs, strict=True)
            ]
        else:
            per_rank = list(zip(call.args, call.kwargs, strict=True))
            if isolate and not bare:
                _check_arguments(call)
        handle = _LocalCallHandle(self, call)
        self._calls.add(handle)
        # Every task is built before the first is queued: a woken rank then competes with the driver
        # for the GIL only while the driver queues the rest and starts waiting.
        tasks = []
        for position, (rank, (args, kwargs)) in enumerate(zip(call.ranks, per_rank, strict=True)):
            run = functools.partial(
                _run,
                handle,
                position,
                threads[rank].host,
                method,
                args,
                kwargs,
                isolate and not copy_here and not bare,
                copy_result,
                instructions,
            )
            tasks.append((threads[rank], run))
        for thread, task in tasks:
            thread.put(task)
        return handle

    def row_address(self, rank: int) -> Any:
        """Kept rows live in this process, where every local rank reads them directly."""
        return ("local", os.getpid())

    def can_fetch_rows(self, address: Any) -> bool:
        return bool(address == ("local", os.getpid()))

    def tensor_address(self) -> Any:
        """Weight transfers' buckets are views in this process, which every local rank reads."""
        return ("local", os.getpid())

    can_receive_tensors = can_fetch_rows

    def rank_stacks(self, ranks: Sequence[int], all_threads: bool, timeout: float) -> dict[int, str]:
        """Read straight off each rank's thread in this process (a thread's frame is visible to all)."""
        return {rank: thread_stacks(self.rank_threads[rank].thread.ident, all_threads) for rank in ranks}

    def cancel_call(self, call: Call, ranks: Sequence[int]) -> bool:
        """Every rank lives in this process: stop the call on each of them here."""
        cancel_in_process(call.instructions.call_id)
        return True

    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        # Ranks may be stuck in a call that outlived its timeout or was abandoned (Ctrl-C): do not wait for them.
        stuck = self.broken is not None or any(not call.settled() for call in list(self._calls))
        self._stop(self.rank_threads, 0.0 if stuck else 2.0)

    @staticmethod
    def _stop(threads: list[RankThread], wait: float) -> None:
        for rank in threads:
            rank.request_stop()
        deadline = time.monotonic() + wait
        for rank in threads:
            rank.join(deadline - time.monotonic())


def _small_arguments(call: Call) -> bool:
    """Whether every argument is of a kind whose size is known and all of them hold little (see module doc)."""
    total = 0
    for values in (*call.args, *(kwargs.values() for kwargs in call.kwargs)):
        for value in values:
            kind = type(value)
            if kind is DataProto:
                batch = value.batch
                if batch is not None:
                    total += sum(t.nbytes for t in batch.values())
                total += sum(a.nbytes for a in value.non_tensor_batch.values())
                if value.non_tensor_batch and any(a.dtype == object for a in value.non_tensor_batch.values()):
                    return False  # object columns: their items' sizes are unknown
            elif kind is torch.Tensor:
                total += value.nbytes
            elif kind not in ATOMS:
                return False
    return total <= DRIVER_COPY_BYTES


def _copy_arguments(
    method: str, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Private copies of one rank's arguments (as ``run_isolated`` makes them), or the one unpicklable error."""
    try:
        return tuple([isolated_copy(a) for a in args]), {k: isolated_copy(v) for k, v in kwargs.items()}
    except Exception as exc:
        raise unpicklable_error(method, (args, kwargs), exc, in_process=True) from exc


def _check_arguments(call: Call) -> None:
    """Refuse, before any rank copies them, arguments whose copy would fail (each distinct object once)."""
    for value in call.unique_values().values:
        try:
            check_copyable(value)
        except Exception as exc:
            raise unpicklable_error(call.method, value, exc, in_process=True) from exc


def _run(
    handle: RankCallHandle,
    position: int,
    host: WorkerHost,
    method: str,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    isolate: bool,
    copy_result: bool,
    instructions: Instructions,
) -> None:
    """One rank's part of a call, on its thread: what a remote rank would see, then the outcome to the handle."""
    ok, value = run_isolated(
        host, method, args, kwargs, isolate_inputs=isolate, isolate_result=copy_result, instructions=instructions
    )
    handle.deliver(position, ok, value)


def _start(handle: RankCallHandle, position: int, host: WorkerHost) -> None:
    failure = host.start()
    handle.deliver(position, failure is None, failure)
