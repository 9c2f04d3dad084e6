"""``MockExecutor``: backend ``"mock"``, every rank run in the calling thread, one after another.

For tests of the core (dispatch, collect, padding, futures, typed calls) that
need no backend at all, as httpx's ``MockTransport`` lets tests run without
a network: ``WorkerGroup(MyWorker, world_size=4, backend="mock")``.  A call
runs each rank's method to completion inside ``submit``, in rank order, with
the same isolation as a real backend (a pickle-equivalent copy of arguments
and results) and the call's ``Instructions`` forwarded whole, so lazy
results stay "on the ranks" (in this process's row store) and tracing works.
Nothing runs concurrently: a worker method that waits for another rank (a
collective) would wait forever; use ``local`` for those.  It is also the
smallest executor written against ``dispatchcore.executor`` alone, and it
passes the conformance suite's cases that need no concurrency.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dispatchcore import DispatchError, hookimpl
from dispatchcore.executor import Call, Executor, GroupSpec, RankCallHandle, WorkerHost, check_options, run_isolated


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
        for host in self._hosts:
            failure = host.start()
            if failure is not None:
                self.shutdown()
                raise failure.to_error()
        self._closed = False

    def submit(self, call: Call) -> RankCallHandle:
        if self._closed:
            raise DispatchError("this mock group is shut down")
        handle = RankCallHandle(call, death_timeout=self.spec.death_timeout)
        isolate = self.spec.isolate
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
        return handle

    def row_address(self, rank: int) -> Any:
        return ("mock", id(self), rank)

    def can_fetch_rows(self, address: Any) -> bool:
        return False  # consumers' rows come from the driver (this process's store holds them anyway)

    def shutdown(self) -> None:
        self._closed = True
        for host in self._hosts:
            host.close()


@hookimpl
def dispatchcore_register_executors(register: Callable[[type[Any]], None]) -> None:
    """Entry point ``mock`` (group ``dispatchcore``)."""
    register(MockExecutor)
