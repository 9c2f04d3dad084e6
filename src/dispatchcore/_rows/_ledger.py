"""Driver-side bookkeeping of rows kept on ranks: handles, budgets, frees, reads.

Each rank result of a lazy call becomes one :class:`RemoteRows` handle.
While any lazy ``DataProto`` (or an in-flight call reading it) refers to the
handle, the rank keeps the rows; when the last reference goes, the handle's
finalizer queues the key, and the next call or read on that group frees it
on the rank (one message per rank, never from a garbage-collector callback).

:class:`RowLedger` (one per executor) counts the bytes each rank holds and
refuses a result that would take a rank past its budget
(:class:`~dispatchcore.MemoryBudgetError`, nothing evicted silently).  It
also reads rows to the driver: straight from this process's store when the
rank lives here (local ranks, torchrun's rank 0), else with a call of the
core's ``_dispatchcore_take_rows`` method on the producing rank, which every
executor runs like any other call.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .._base import DispatchError, MemoryBudgetError, WorkerDiedError
from .._data import DataProto
from .._spi import Call
from ._records import FREE_ROWS_METHOD, TAKE_ROWS_METHOD, HeldRows, RowRequest
from ._remote import RemoteRows
from ._store import ROW_STORE

if TYPE_CHECKING:
    from .._spi import Executor

#: Default per-rank budget for rows kept by lazy calls (``WorkerGroup(lazy_budget_bytes=...)``).
DEFAULT_BUDGET = 8 << 30


class RowLedger:
    """Per executor: bytes held per rank against the budget, keys waiting to be freed, reads."""

    def __init__(self, executor: Executor, budget: int | None) -> None:
        self._executor = weakref.ref(executor)
        self.budget = budget
        self._lock = threading.Lock()
        self._held: dict[int, int] = {}
        self._unfreed: dict[int, list[str]] = {}
        #: Ranks seen dead (their kept rows are gone).
        self.dead: set[int] = set()

    def adopt(self, ranks: Sequence[int], results: list[Any]) -> list[Any]:
        """Per-rank results with each :class:`HeldRows` turned into a :class:`RemoteRows` handle.

        Past the budget on any rank, the call's kept rows are freed at once
        and :class:`MemoryBudgetError` names the rank, the budget and the fix.
        """
        executor = self._executor()
        assert executor is not None  # noqa: S101 - the group that made the call is alive
        incoming: dict[int, int] = {}
        for rank, value in zip(ranks, results, strict=True):
            if isinstance(value, HeldRows):
                incoming[rank] = incoming.get(rank, 0) + value.nbytes
        with self._lock:
            over = [
                r
                for r, extra in incoming.items()
                if self.budget is not None and self._held.get(r, 0) + extra > self.budget
            ]
            if not over:
                for rank, extra in incoming.items():
                    self._held[rank] = self._held.get(rank, 0) + extra
                self.dead.difference_update(incoming)  # a replaced rank answered: it keeps rows again
        if over:
            for rank, value in zip(ranks, results, strict=True):
                if isinstance(value, HeldRows):
                    self._unfreed.setdefault(rank, []).append(value.key)
            rank = over[0]
            raise MemoryBudgetError(
                f"rank {rank} would hold {self._held.get(rank, 0) + incoming[rank]:,} bytes of lazy results, "
                f"over its budget of {self.budget:,} bytes ({self._held.get(rank, 0):,} held before this call). "
                "Drop references to lazy results you no longer need (or .materialize() them), or raise the "
                "budget with WorkerGroup(..., lazy_budget_bytes=...)"
            )
        return [
            RemoteRows(self, rank, executor.row_address(rank), value) if isinstance(value, HeldRows) else value
            for rank, value in zip(ranks, results, strict=True)
        ]

    def held_bytes(self, rank: int) -> int:
        """Bytes of lazy results rank ``rank`` holds for live references."""
        return self._held.get(rank, 0)

    def release(self, rank: int, key: str, nbytes: int) -> None:
        """A handle's finalizer: account at once; the rank frees at the next :meth:`flush`."""
        with self._lock:
            self._held[rank] = max(0, self._held.get(rank, 0) - nbytes)
            self._unfreed.setdefault(rank, []).append(key)

    def flush(self) -> None:
        """Tell ranks to drop the keys released since the last flush (one call per rank, not waited on)."""
        if not self._unfreed:
            return
        with self._lock:
            unfreed, self._unfreed = self._unfreed, {}
        local = [k for keys in unfreed.values() for k in keys if ROW_STORE.has(k)]
        ROW_STORE.free(local)
        executor = self._executor()
        if executor is None or executor.broken:
            return
        for rank, keys in unfreed.items():
            remote = [k for k in keys if k not in local]
            if remote:
                try:
                    executor.submit(Call(FREE_ROWS_METHOD, (rank,), [(remote,)], [{}]))
                except Exception:  # noqa: BLE001, S112 - a gone rank took its rows with it
                    continue

    def read(self, requests: Sequence[RowRequest], timeout: float | None) -> list[DataProto]:
        """Rows for ``requests`` on the driver (copies; one call per producing rank)."""
        self.flush()
        out: list[DataProto | None] = [None] * len(requests)
        by_rank: dict[int, list[int]] = {}
        for i, request in enumerate(requests):
            if ROW_STORE.has(request.key):
                out[i] = ROW_STORE.take(request)
            else:
                by_rank.setdefault(request.rank, []).append(i)
        executor = self._executor()
        if by_rank:
            if executor is None:
                raise DispatchError("the group holding these lazy rows was shut down; its rows are gone")
            lost = sorted(self.dead & set(by_rank))
            if lost or executor.broken:
                rank = lost[0] if lost else min(by_rank)
                why = executor.broken or "it died"
                raise WorkerDiedError(rank, f"the rows it kept for a lazy result are lost ({why})")
            handles = {
                rank: executor.submit(Call(TAKE_ROWS_METHOD, (rank,), [([requests[i] for i in idx],)], [{}], timeout))
                for rank, idx in by_rank.items()
            }
            for rank, handle in handles.items():
                for i, part in zip(by_rank[rank], handle.result(timeout)[0], strict=True):
                    out[i] = part
        return [part for part in out if part is not None]
