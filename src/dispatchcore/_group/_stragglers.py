"""Ranks still running a call that has already ended, recorded so no later call queues silently behind them.

Those still in it after ``cancel_grace`` are *stuck*; ``_stuck`` decides (``docs/calls-that-cannot-hang.md``).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

from .._spi import Call, CallHandle, Executor


@dataclass
class Straggler:
    """A rank still running ``method`` of an ended call, and why the call ended."""

    handle: CallHandle
    method: str
    why: str
    #: When it was asked to stop (``time.monotonic()``).
    since: float


def unfinished_ranks(handle: CallHandle, call: Call) -> list[int]:
    """The ranks of ``call`` that have not answered (every rank if the handle cannot tell)."""
    waiting = getattr(handle, "waiting_ranks", None)
    if waiting is not None:
        ranks: list[int] = waiting()
        return ranks
    return [] if handle.done() else list(call.ranks)


class Stragglers:
    """The stragglers of one group's ranks, by rank."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_rank: dict[int, Straggler] = {}

    def __bool__(self) -> bool:
        return bool(self._by_rank)

    def track(self, executor: Executor, handle: CallHandle, call: Call, why: str) -> list[int]:
        """Ask the ranks of ``call`` still running to stop; record them; which they are."""
        ranks = unfinished_ranks(handle, call)
        if not ranks:
            return []
        try:
            executor.cancel_call(call, ranks)
        except Exception:  # noqa: BLE001 - a rank that cannot be asked is found stuck later
            pass
        now = time.monotonic()
        with self._lock:
            for rank in ranks:
                self._by_rank[rank] = Straggler(handle, call.method, why, now)
        return ranks

    def settle(self, ranks: tuple[int, ...] | list[int], grace: float) -> dict[int, Straggler]:
        """Wait for stragglers among ``ranks`` until ``grace`` after each was asked; the ones still running."""
        with self._lock:
            mine = {r: s for r, s in self._by_rank.items() if r in ranks}
        stuck: dict[int, Straggler] = {}
        for rank, straggler in mine.items():
            wait = getattr(straggler.handle, "wait_settled", None)
            if wait is not None:
                wait(max(0.0, straggler.since + grace - time.monotonic()))
            call = getattr(straggler.handle, "call", None)
            still = unfinished_ranks(straggler.handle, call) if isinstance(call, Call) else []
            if rank in still:
                stuck[rank] = straggler
        with self._lock:
            for rank in mine:
                if rank not in stuck and self._by_rank.get(rank) is mine[rank]:
                    del self._by_rank[rank]
        return stuck

    def forget(self, ranks: Any) -> None:
        """These ranks were restarted: nothing of theirs runs any more."""
        with self._lock:
            for rank in ranks:
                self._by_rank.pop(rank, None)
