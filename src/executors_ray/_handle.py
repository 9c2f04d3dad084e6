"""The core's row reads and frees: Ray tasks in the actors' ``rows`` group, so they never wait behind a call.

Results are taken as each lands, so a dead rank's failed reference is seen at once.
"""

from __future__ import annotations

import time
from typing import Any

from dispatchcore.executor import Call, LaneCallHandle, LaneDriver, RankCallHandle

from ._rank_actors import RankActors
from ._store import unpack
from ._tags import FAILED

#: How long the first ``ray.get`` waits for every result at once before results are taken as they land.
FAST_GET_S = 0.05


class RowsCallHandle(LaneCallHandle):
    """One row read or free: a result reference per rank of the call; liveness is the lane's (``check_alive``)."""

    def __init__(self, lane: LaneDriver, rank_actors: RankActors, call: Call, refs: list[Any]) -> None:
        super().__init__(lane, call)
        self.rows, self.row_buffers = None, None  # its results come by Ray, not into the lane's receive buffers
        #: The group's actors (not its executor): the Ray they belong to, names and nodes, whether it shut down.
        self.rank_actors = rank_actors
        self.refs = refs
        self._copy = rank_actors.isolate and not call.results_are_copied
        self._fast_tried = False
        #: Set by :meth:`wait_settled`: wait for every rank, not only until the call ended.
        self._draining = False

    # -- results -----------------------------------------------------------------
    def wait_for_progress(self, seconds: float) -> None:
        ray = self.rank_actors.ray
        deadline = time.monotonic() + seconds
        if not self._fast_tried and not self.streaming:  # a stream wants the first result, not all
            self._fast_tried = True
            try:
                values = ray.get(self.refs, timeout=min(seconds, FAST_GET_S))
            except Exception:  # noqa: BLE001 - timed out, or a rank died: the waits below say which
                pass
            else:
                for position, value in enumerate(values):
                    self._accept(position, value)
                return
        while self._draining or not RankCallHandle.done(self):
            waiting = self.waiting_positions()
            if not waiting:
                return
            refs = [self.refs[p] for p in waiting]
            gather = None if self._draining else self.gather_deadline  # a rank raised: the call ends soon
            left = max(0.0, (deadline if gather is None else min(deadline, gather)) - time.monotonic())
            ready, rest = ray.wait(refs, num_returns=1, timeout=left)
            if not ready:
                return
            if rest:  # take whatever else landed meanwhile in the same round
                more, _ = ray.wait(rest, num_returns=len(rest), timeout=0)
                ready += more
            self._take([p for p, ref in zip(waiting, refs, strict=True) if ref in ready])
            if self.streaming and not self._draining:
                return

    def wait_settled(self, timeout: float) -> bool:
        """Wait for ranks still running after the call ended (fail fast, cancel) to answer."""
        self._draining = True
        try:
            return super().wait_settled(timeout)
        finally:
            self._draining = False

    def _take(self, positions: list[int]) -> None:
        """Deliver ready results (one ``ray.get``; per reference only if one failed)."""
        ray = self.rank_actors.ray
        try:
            values = ray.get([self.refs[p] for p in positions])
        except Exception:  # noqa: BLE001 - find which rank it was
            for position in positions:
                try:
                    value = ray.get(self.refs[position])
                except Exception as exc:  # noqa: BLE001
                    self.rank_died(position, self.rank_actors.gone(self.call.ranks[position], exc))
                else:
                    self._accept(position, value)
            return
        for position, value in zip(positions, values, strict=True):
            self._accept(position, value)

    def _accept(self, position: int, value: Any) -> None:
        """Deliver one stored answer: ``(OK_PACKED, packed value)`` or ``(FAILED, RemoteFailure)``."""
        tag, payload = value
        ok = tag != FAILED
        self.deliver(position, ok, unpack(payload, copy=self._copy) if ok else payload)

    def done(self) -> bool:
        if RankCallHandle.done(self):
            return True
        refs = [self.refs[p] for p in self.waiting_positions()]
        ready, _ = self.rank_actors.ray.wait(refs, num_returns=len(refs), timeout=0, fetch_local=False)
        return len(ready) == len(refs)
