"""Driver-side bookkeeping of rows kept on ranks: handles, budgets, frees, reads.

A finalizer only queues its key (never a message from a garbage collector callback); the key rides the
next call or read that reaches its rank.  Past a rank's budget a result is refused, never evicted silently.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from .._base import DispatchError, MemoryBudgetError, WorkerDiedError
from .._data import DataProto
from .._spi import Call, Instructions, Operation
from ._records import ROWS_CALL, HeldRows, RowAccess, RowRequest
from ._remote import RemoteRows
from ._store import ROW_STORE

if TYPE_CHECKING:
    from .._spi import Executor

#: How a ledger sends its beside calls: the group's submit path (a handle with ``result(timeout)``).
Send = Callable[[Call], Any]

#: Instructions of every beside row call.
_ROWS = Instructions(operation=Operation.ROWS)

#: Default per-rank budget for rows kept by lazy calls (``WorkerGroup(lazy_budget_bytes=...)``).
DEFAULT_BUDGET = 8 << 30


class RowLedger:
    """Per executor: bytes held per rank against the budget, keys waiting to be freed, reads."""

    def __init__(self, executor: Executor, budget: int | None) -> None:
        self._executor = weakref.ref(executor)
        self.budget = budget
        self._lock = threading.RLock()  # a handle's finalizer may run inside a locked section (cyclic GC)
        self._held: dict[int, int] = {}
        #: Keys released on the driver, by rank, waiting for the next call or read that reaches the rank.
        self.unfreed: dict[int, list[str]] = {}
        #: Ranks seen dead (their kept rows are gone).
        self.dead: set[int] = set()
        #: How row calls are sent: the group's call pipeline, set as the group is made (nothing else sends them).
        self.send: Send | None = None

    def adopt(self, ranks: Sequence[int], results: list[Any]) -> list[Any]:
        """Per-rank results with each :class:`HeldRows` turned into a handle; past a budget, freed and refused."""
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
                    self.unfreed.setdefault(rank, []).append(value.key)
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

    def release(self, rank: int, key: str, nbytes: int) -> None:
        """A handle's finalizer: account at once; the rank frees at the next :meth:`flush`."""
        with self._lock:
            self._held[rank] = max(0, self._held.get(rank, 0) - nbytes)
            self.unfreed.setdefault(rank, []).append(key)

    def forget(self, ranks: Sequence[int], keep: str) -> None:
        """A lazy call under key ``keep`` ended early: whatever its ranks kept (now or when they finish) is freed.

        Never adopted, such rows would stay on the ranks for good; the free rides the next call that
        reaches each rank (its method thread runs that call only after the ended one), an unknown key is skipped.
        """
        with self._lock:
            for rank in ranks:
                self.unfreed.setdefault(rank, []).append(f"{keep}/{rank}")

    def held_on(self, ranks: Sequence[int]) -> dict[int, int]:
        """Bytes of kept rows still referenced on each of ``ranks`` that holds any."""
        with self._lock:
            return {r: self._held[r] for r in ranks if self._held.get(r, 0) > 0}

    def renumber(self, mapping: dict[int, int]) -> None:
        """After a shrink: ranks keep their bookkeeping under their new numbers; ranks not in ``mapping`` are gone."""
        with self._lock:
            self._held = {mapping[r]: b for r, b in self._held.items() if r in mapping}
            self.unfreed = {mapping[r]: keys for r, keys in self.unfreed.items() if r in mapping}
            self.dead = {mapping[r] for r in self.dead if r in mapping}

    def take_frees(self, ranks: Sequence[int]) -> dict[int, list[str]]:
        """The keys queued for ``ranks``, handed to the call about to reach them (keys kept here: freed now)."""
        if not self.unfreed:
            return {}
        with self._lock:
            taken = {rank: self.unfreed.pop(rank) for rank in ranks if rank in self.unfreed}
        out: dict[int, list[str]] = {}
        for rank, keys in taken.items():
            local = [k for k in keys if ROW_STORE.has(k)]
            ROW_STORE.free(local)
            remote = [k for k in keys if k not in local]
            if remote:
                out[rank] = remote
        return out

    def give_back(self, taken: dict[int, list[str]]) -> None:
        """The call that was to carry ``taken`` was not sent: they wait for the next one."""
        with self._lock:
            for rank, keys in taken.items():
                self.unfreed.setdefault(rank, []).extend(keys)

    def flush(self) -> None:
        """Send every queued free now, one beside call per rank, not waited on (no call follows: shutdown)."""
        executor = self._executor()
        with self._lock:
            pending = list(self.unfreed)
        taken = self.take_frees(pending)
        if executor is None or executor.broken:
            return
        for rank, keys in taken.items():
            call = Call(ROWS_CALL, (rank,), [(RowAccess((), tuple(keys)),)], [{}], None, True, _ROWS, True)
            with contextlib.suppress(Exception):  # a gone rank took its rows with it
                self._send(call)

    def _send(self, call: Call) -> Any:
        if self.send is None:
            raise DispatchError("this row ledger belongs to no group yet (its send is unset); nothing was sent")
        return self.send(call)

    def read(self, requests: Sequence[RowRequest], timeout: float | None) -> list[DataProto]:
        """Rows for ``requests`` on the driver (copies; one beside call per producing rank, carrying its frees)."""
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
            frees = self.take_frees(list(by_rank))
            handles = {}
            for rank, idx in by_rank.items():
                access = RowAccess(tuple(requests[i] for i in idx), tuple(frees.pop(rank, ())))
                call = Call(ROWS_CALL, (rank,), [(access,)], [{}], timeout, True, _ROWS, True)
                try:
                    handles[rank] = self._send(call)
                except BaseException:
                    self.give_back({rank: list(access.free)})
                    self.give_back(frees)
                    raise
            for rank, handle in handles.items():
                for i, part in zip(by_rank[rank], handle.result(timeout)[0], strict=True):
                    out[i] = part
        return [part for part in out if part is not None]
