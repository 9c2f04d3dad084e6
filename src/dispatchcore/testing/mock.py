"""``MockExecutor``: backend ``"mock"``, every rank of a group run on one thread, one after another.

For core tests that need no backend.  Ranks keep a real backend's isolation
and get the call's ``Instructions`` whole (lazy results, tracing); they never
run at the same time, so a collective waits until its call times out: use
``local`` for those.  The smallest executor written against ``dispatchcore.executor``.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Sequence
from typing import Any

from dispatchcore import DispatchError, hookimpl
from dispatchcore.executor import (
    Call,
    Executor,
    GroupSpec,
    RankCallHandle,
    WorkerHost,
    cancel_in_process,
    check_options,
    run_isolated,
    thread_stacks,
)

__all__ = ["MockExecutor"]


class MockExecutor(Executor):
    """Ranks as ``WorkerHost`` objects in this process; ``submit`` runs the call before it returns."""

    name = "mock"

    def __init__(self, spec: GroupSpec) -> None:
        super().__init__(spec)
        check_options("mock", spec.options, {})
        self._hosts = [
            WorkerHost(spec.worker_cls, rank, spec.world_size, spec.init_args, dict(spec.init_kwargs))
            for rank in range(spec.world_size)
        ]
        self._closed = False
        self._calls: queue.SimpleQueue[tuple[Call, RankCallHandle] | None] = queue.SimpleQueue()
        for host in self._hosts:
            failure = host.start()
            if failure is not None:
                self.shutdown()
                raise failure.to_error()
        self._thread = threading.Thread(target=self._serve, name=f"dispatchcore-mock-{spec.name}", daemon=True)
        self._thread.start()

    def submit(self, call: Call) -> RankCallHandle:
        if self._closed:
            raise DispatchError("this mock group is shut down")
        handle = RankCallHandle(call, death_timeout=self.spec.death_timeout, on_broken=self.mark_broken)
        self._calls.put((call, handle))
        return handle

    def _serve(self) -> None:
        """The group's one thread: each call's ranks in rank order, calls in the order submitted."""
        isolate = self.spec.isolate
        while (item := self._calls.get()) is not None:
            call, handle = item
            for position, (rank, args, kwargs) in enumerate(zip(call.ranks, call.args, call.kwargs, strict=True)):
                ok, value = run_isolated(
                    self._hosts[rank],
                    call.method,
                    args,
                    kwargs,
                    isolate_inputs=isolate,
                    isolate_result=isolate and not call.results_are_copied,
                    instructions=call.instructions,
                )
                handle.deliver(position, ok, value)
        for host in self._hosts:
            host.close()  # the private event loops of async methods

    def rank_stacks(self, ranks: Sequence[int], all_threads: bool, timeout: float) -> dict[int, str]:
        """Every rank runs on the group's one thread: a rank in its call shows it, the others show it too."""
        return {rank: thread_stacks(self._thread.ident, all_threads) for rank in ranks}

    def cancel_call(self, call: Call, ranks: Sequence[int]) -> bool:
        """Every rank is in this process: the one in the call stops, the ones after it skip it."""
        if self._closed:
            return False
        cancel_in_process(call.instructions.call_id)
        return True

    def row_address(self, rank: int) -> Any:
        return ("mock", id(self), rank)

    def shutdown(self) -> None:
        """Stop taking calls; the thread exits after the queued ones (a daemon: never waited for)."""
        if self._closed:
            return
        self._closed = True
        if hasattr(self, "_thread"):
            self._calls.put(None)


@hookimpl
def dispatchcore_register_executors(register: Callable[[type[Any]], None]) -> None:
    """Entry point ``mock`` (group ``dispatchcore``)."""
    register(MockExecutor)
