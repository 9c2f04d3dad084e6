"""Rank-side runtime shared by every executor: :class:`WorkerHost` runs methods and never raises.

Failures come back as picklable :class:`RemoteFailure` records, so the group stays in step.
"""

from __future__ import annotations

import asyncio
import inspect
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from .._base import CallInterrupted, WorkerDiedError, WorkerError
from .._data import DataProto
from .._rows import ROW_STORE, RowFetcher, resolve_lazy_arguments
from .._spi import PLAIN, Instructions, Operation
from .._trace import TimedResult, now_us
from .._transfer import TensorLink
from .._transfer import run_step as run_transfer_step
from .._wire import find_unpicklable
from .._worker import (
    CollectiveLink,
    enter_method,
    holds_sharded_group,
    leave_method,
    load_replica,
    mesh_info,
    rank_context,
    rejoin,
    renumber,
    replica_version,
    sharded_state,
    swap_collective,
)
from ._cancel import GATE, INTERRUPT_AFTER_S, RunningCall
from ._render import message, traceback_text, type_name
from ._unpicklable import wording

#: ``RemoteFailure.unpicklable`` without the value that failed.
_UNSET: Any = object()

#: Result types that are never awaitable (skips the awaitable check).
_PLAIN = frozenset({int, float, str, bool, bytes, list, tuple, dict})


@dataclass
class RemoteFailure:
    """A worker-side exception, reduced to what crosses a process boundary."""

    rank: int
    method: str
    exc_type: str
    message: str
    traceback: str
    #: Another rank the worker saw dead (reading rows it kept): the driver raises ``WorkerDiedError`` for it.
    died_rank: int | None = None

    @classmethod
    def capture(cls, rank: int, method: str, exc: BaseException) -> RemoteFailure:
        """``exc`` as text; never raises, whatever its ``__str__``, ``__repr__`` or attributes raise (``_render``)."""
        text = traceback_text(exc)
        if issubclass(type(exc), WorkerDiedError):  # by type: no attribute of ``exc`` is read
            died = cast("WorkerDiedError", exc)
            try:
                return cls(rank, method, type_name(exc), str(died.detail), text, int(died.rank))
            except BaseException:  # noqa: BLE001 - a subclass's broken attributes: report it as it is
                pass
        return cls(rank, method, type_name(exc), message(exc), text)

    @classmethod
    def unpicklable(
        cls, rank: int, method: str, part: str, exc: BaseException, *, in_process: bool, value: Any = _UNSET
    ) -> RemoteFailure:
        """The one wording, on every backend, for a rank's ``part`` ("arguments" or "result") that cannot be pickled."""
        failure = cls.capture(rank, method, exc)
        fix = "return picklable values" if part == "result" else None
        try:
            culprit = None if value is _UNSET else find_unpicklable(value, part, share_callables=in_process)
            where = f"its {part}" if culprit is None else culprit.where(f"its {part}")
            failure.message = wording(where, culprit, exc, fix)
        except BaseException:  # noqa: BLE001 - the value's own methods raised while it was searched
            failure.message = wording(f"its {part}", None, exc, fix)
        return failure

    def to_error(self) -> WorkerError | WorkerDiedError:
        if self.died_rank is not None:
            detail = f"{self.message} (seen by rank {self.rank} in {self.method!r} while reading rows it kept)"
            error = WorkerDiedError(self.died_rank, detail, self.method)
            error.seen_by = self.rank
            return error
        return WorkerError(self.rank, self.method, self.traceback, self.exc_type, self.message)


def first_failure(failures: Mapping[int, RemoteFailure], ranks: Sequence[int]) -> WorkerError | WorkerDiedError:
    """The lowest call position's error, noting which other ranks raised too."""
    first = min(failures)
    error = failures[first].to_error()
    others = sorted(ranks[p] for p in failures if p != first)
    if others:
        error.add_note(f"rank(s) {others} raised too")
    return error


class WorkerHost:
    """One rank's worker object plus the loop its coroutines run on."""

    def __init__(
        self,
        worker_cls: type,
        rank: int,
        world_size: int,
        init_args: tuple[Any, ...] = (),
        init_kwargs: dict[str, Any] | None = None,
    ) -> None:
        self.rank = rank
        self.world_size = world_size
        self._worker_cls = worker_cls
        self._init_args = init_args
        self._init_kwargs = dict(init_kwargs or {})
        self._loop: asyncio.AbstractEventLoop | None = None
        self._bound: dict[str, Any] = {}
        self.worker: Any = None
        #: The executor's rank-to-rank transport for lazy arguments' rows kept in other processes.
        self.fetch_rows: RowFetcher | None = None
        #: Set by an executor whose ``fetch_rows`` returns fresh, writable memory (used without a copy).
        self.fetched_rows_private = False
        #: Set by an executor for an ``isolate=False`` group: kept rows reach a consuming worker uncopied.
        self.share_kept_rows = False
        self._collective_context: tuple[Any, int, int] | None = None
        #: The executor's rank-to-rank path for weight transfers (``None``: through the driver).
        self.tensor_link: TensorLink | None = None
        #: Weight transfers under way on this rank, by id (``_transfer``).
        self.transfers: dict[int, Any] = {}
        #: A replica's tensors arriving for this (replaced) rank, until ``Operation.HANDOVER`` loads them.
        self.handover: dict[str, Any] = {}
        #: How this rank's group runs ``dispatchcore.collective`` (set by the executor before ``start``).
        self.collective: CollectiveLink = CollectiveLink("?", "this executor gives its ranks no collective link")

    def start(self) -> RemoteFailure | None:
        """Build the worker; a failure is returned (method ``__init__``), not raised."""
        previous = swap_collective((self.collective, self.rank, self.world_size))
        try:
            with rank_context(self.rank, self.world_size):
                self.worker = self._worker_cls(*self._init_args, **self._init_kwargs)
        except BaseException as exc:  # noqa: BLE001 - reported to the driver
            return RemoteFailure.capture(self.rank, "__init__", exc)
        finally:
            swap_collective(previous)
        return None

    def run(
        self,
        method: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        instructions: Instructions = PLAIN,
    ) -> tuple[bool, Any]:
        """``(True, value)`` or ``(False, RemoteFailure)``, as ``instructions`` (``call.instructions``) order."""
        if instructions.free:
            ROW_STORE.free(instructions.free)
        running = GATE.enter(instructions.call_id)
        if running is None:
            return False, _cancelled(self.rank, method, "before it began on this rank")
        try:
            if instructions.timed:
                start = now_us()
                ok, value = self._run(method, args, kwargs, instructions, running)
                return ok, (TimedResult(value, start, now_us(), os.getpid()) if ok else value)
            return self._run(method, args, kwargs, instructions, running)
        except CallInterrupted:  # an interrupt that landed just as the method returned
            return False, _cancelled(self.rank, method, "as it returned")
        finally:
            while True:  # leave the gate, even if an interrupt that landed as the method returned fires in here
                try:
                    GATE.leave(running)
                    break
                except CallInterrupted:
                    continue

    def cancel(self, call_id: int, interrupt_after: float = INTERRUPT_AFTER_S) -> bool:
        """Stop call ``call_id`` wherever it runs in this process (see :func:`cancel_in_process`)."""
        return GATE.cancel(call_id, interrupt_after) > 0

    def _run(
        self,
        method: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        instructions: Instructions,
        running: RunningCall,
    ) -> tuple[bool, Any]:
        if instructions.operation is not None:
            return self._operation(instructions.operation, method, args, running)
        keep = instructions.keep_rows
        fn = self._bound.get(method)
        if fn is None:
            try:
                fn = self._bound[method] = getattr(self.worker, method)
            except AttributeError as exc:
                failure = RemoteFailure.capture(self.rank, method, exc)
                failure.message = f"{type(self.worker).__name__} has no method {method!r}"
                return False, failure
        try:
            args, kwargs = resolve_lazy_arguments(
                args, kwargs, self.fetch_rows, self.fetched_rows_private, self.share_kept_rows
            )
            context = self._collective_context
            if context is None or context[0] is not self.collective:  # inline: every call on every rank
                context = self._method_context()
            previous = enter_method(running, context)
            try:
                value = fn(*args, **kwargs)
                if value is not None and type(value) not in _PLAIN and inspect.isawaitable(value):
                    value = self._await(value, running)
            finally:
                leave_method(previous)
            if keep is not None and isinstance(value, DataProto):
                value = ROW_STORE.keep(f"{keep}/{self.rank}", value)
        except BaseException as exc:  # noqa: BLE001 - reported to the driver
            return False, RemoteFailure.capture(self.rank, method, exc)
        return True, value

    def _operation(
        self, operation: Operation, label: str, args: tuple[Any, ...], running: RunningCall
    ) -> tuple[bool, Any]:
        """The core's own work: kept rows freed and read (a ``RowAccess``), a weight-transfer step, a rejoin,
        a resize, the mesh query, a replica hand-over."""
        try:
            if operation is Operation.ROWS:
                access = args[0]
                ROW_STORE.free(access.free)
                return True, [ROW_STORE.take(request) for request in access.requests]
            if operation is Operation.TRANSFER:
                return True, run_transfer_step(self, args)
            if operation is Operation.MESH:
                return True, mesh_info(self.worker, *args)
            if operation is Operation.RESIZE:
                return True, self._resize(running, *args)
            if operation is Operation.HANDOVER and args[0] == "version":
                return True, replica_version(self.worker)
            previous = enter_method(running, self._method_context())  # the worker's own hooks run here
            try:
                if operation is Operation.REJOIN:
                    rejoin(self.worker, *args)
                elif operation is Operation.SHARDED:  # the hook may build groups: in the method's context
                    return True, sharded_state(self.worker, args[0])
                else:  # Operation.HANDOVER, ("load", version)
                    state, self.handover = self.handover, {}
                    load_replica(self.worker, state, args[1])
            finally:
                leave_method(previous)
            return True, None
        except BaseException as exc:  # noqa: BLE001 - reported to the driver
            return False, RemoteFailure.capture(self.rank, label, exc)

    def _resize(self, running: RunningCall, change: Any, rank: int, replay: list[Any]) -> Any:
        """``Operation.RESIZE``: with no ``change``, whether this rank's group is sharded; else rejoin as ``rank``."""
        if change is None:
            return holds_sharded_group(self.collective)
        self.rank, self.world_size = rank, change.world_size
        renumber(self.worker, rank, change.world_size)
        if "WORLD_SIZE" in change.env:  # a process of its own: its rank variables follow
            os.environ["RANK"] = str(rank)
        previous = enter_method(running, self._method_context())
        try:
            rejoin(self.worker, change, replay)
        finally:
            leave_method(previous)
        return None

    def _method_context(self) -> tuple[Any, int, int]:
        """The collective context a method runs in (made again when the executor relinked)."""
        context = self._collective_context = (self.collective, self.rank, self.world_size)
        return context

    def _await(self, awaitable: Any, running: RunningCall) -> Any:
        """Run a coroutine method to its end on the private loop, as a task :meth:`cancel` can cancel."""
        if self._loop is None or self._loop.is_closed():
            self._loop = asyncio.new_event_loop()
        loop = self._loop
        task = loop.create_task(_await(awaitable))
        running.loop, running.task = loop, task
        if running.requested:  # cancelled between the call and here
            task.cancel()
        return loop.run_until_complete(task)

    def close(self) -> None:
        """Close the private event loop, if one was made."""
        if self._loop is not None and not self._loop.is_closed():
            self._loop.close()
        self._loop = None


def _cancelled(rank: int, method: str, when: str) -> RemoteFailure:
    return RemoteFailure(rank, method, "CallInterrupted", f"the call was cancelled {when}", "")


async def _await(awaitable: Any) -> Any:
    return await awaitable
