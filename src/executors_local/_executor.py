"""``LocalExecutor``: ranks as worker objects, each on its own daemon thread.

Everything here but the thread-per-rank layout comes from the public
executor contract: :class:`~dispatchcore.executor.RankThread` serves a rank,
:func:`~dispatchcore.executor.run_isolated` gives it what a pickle round trip
would (copied on the rank's own thread, so copies run in parallel), and
:class:`~dispatchcore.executor.RankCallHandle` owns every time bound.
A rank whose thread exited is reported dead.  Lazy results stay in this
process, so a consuming rank reads a producer's rows directly (copying them
once, as isolation asks).
"""

from __future__ import annotations

import functools
import os
import time
import weakref
from typing import Any

from dispatchcore import DispatchError
from dispatchcore.executor import (
    Call,
    Executor,
    GroupSpec,
    RankCallHandle,
    RankThread,
    WorkerHost,
    check_options,
    run_isolated,
)

_DEFAULTS = {"start_timeout": 300.0}


class _LocalCallHandle(RankCallHandle):
    def __init__(self, executor: LocalExecutor, call: Call) -> None:
        super().__init__(call, death_timeout=executor.spec.death_timeout, on_broken=executor.mark_broken)
        self._threads = executor.rank_threads

    def check_alive(self, waiting: list[int]) -> None:
        for position in waiting:
            if not self._threads[self.call.ranks[position]].is_alive():
                self.rank_died(position, "its thread is no longer running")


class LocalExecutor(Executor):
    """Backend ``"local"``: zero setup, threads in this process.

    Options: ``start_timeout`` (seconds to wait for every worker's
    ``__init__``, default 300).
    """

    name = "local"

    def __init__(self, spec: GroupSpec) -> None:
        super().__init__(spec)
        options = check_options(self.name, spec.options, _DEFAULTS)
        self._closed = False
        #: Calls not known to be finished (see ``shutdown``).
        self._calls: weakref.WeakSet[RankCallHandle] = weakref.WeakSet()
        self.rank_threads = [
            RankThread(
                WorkerHost(spec.worker_cls, rank, spec.world_size, spec.init_args, dict(spec.init_kwargs)),
                f"dispatchcore-{spec.name}-rank{rank}",
            )
            for rank in range(spec.world_size)
        ]
        ranks = tuple(range(spec.world_size))
        started = _LocalCallHandle(self, Call("__init__", ranks, [()] * len(ranks), [{}] * len(ranks)))
        for position, rank in enumerate(self.rank_threads):
            rank.put(functools.partial(_start, started, position, rank.host))
        try:
            started.result(float(options["start_timeout"]))
        except BaseException:
            self.shutdown()
            raise

    def submit(self, call: Call) -> RankCallHandle:
        if self._closed:
            raise DispatchError("this local group is shut down")
        handle = _LocalCallHandle(self, call)
        self._calls.add(handle)
        isolate = self.spec.isolate
        copy_result = isolate and not call.results_are_copied
        method, timed = call.method, call.timed
        for position, rank in enumerate(call.ranks):
            host = self.rank_threads[rank].host
            args, kwargs = call.args[position], call.kwargs[position]

            def task(position: int = position, host: WorkerHost = host, args: Any = args, kwargs: Any = kwargs) -> None:
                handle.deliver(
                    position,
                    *run_isolated(
                        host, method, args, kwargs, isolate_inputs=isolate, isolate_result=copy_result, timed=timed
                    ),
                )

            self.rank_threads[rank].put(task)
        return handle

    def row_address(self, rank: int) -> Any:
        """Kept rows live in this process, where every local rank reads them directly."""
        return ("local", os.getpid())

    def can_fetch_rows(self, address: Any) -> bool:
        return bool(address == ("local", os.getpid()))

    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        for rank in self.rank_threads:
            rank.request_stop()
        # Ranks may be stuck in a call that outlived its timeout or was abandoned (Ctrl-C): do not wait for them.
        stuck = self.broken is not None or any(not call.done() for call in list(self._calls))
        deadline = time.monotonic() + (0.0 if stuck else 2.0)
        for rank in self.rank_threads:
            rank.join(deadline - time.monotonic())


def _start(handle: RankCallHandle, position: int, host: WorkerHost) -> None:
    failure = host.start()
    handle.deliver(position, failure is None, failure)
