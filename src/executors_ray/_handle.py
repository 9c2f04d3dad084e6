"""A Ray call's results: one object reference per rank, pulled by the core's call handle.

:class:`~dispatchcore.executor.RankCallHandle` owns every time bound; this
module only says how results arrive and how death is seen on Ray:

* :meth:`RayCallHandle.wait_for_progress` first tries one ``ray.get`` of
  every reference, bounded by :data:`FAST_GET_S` (a short call's results in
  one round trip), then waits with ``ray.wait`` and fetches each result as
  it lands, so a dead rank's failed reference (``RayActorError``) and a
  raising rank's failure are seen at once (a get of every reference would
  wait for the slowest rank: fail fast needs the first);
* :meth:`RayCallHandle.check_alive` pings ranks still running in their
  actor's ``control`` concurrency group: a failed ping, or one unanswered
  for ``death_timeout``, means the rank is gone (a hung node, a lost process).

``ray.get`` is never called on a reference that is not ready without a bound.
"""

from __future__ import annotations

import time
from typing import Any

from dispatchcore.executor import Call, RankCallHandle

from . import _payload
from ._rank_actors import RankActors
from ._tags import CONTROL_GROUP

#: How long the first ``ray.get`` waits for every result at once before results are taken as they land.
FAST_GET_S = 0.05


class RayCallHandle(RankCallHandle):
    """One submitted call: a result reference per rank of the call.

    With ``fetch=False`` the handle only waits until every result sits in the
    object store and delivers ``None`` for each (see :meth:`readiness`).
    """

    def __init__(self, rank_actors: RankActors, call: Call, refs: list[Any], *, fetch: bool = True) -> None:
        super().__init__(
            call,
            death_timeout=rank_actors.death_timeout,
            on_broken=rank_actors.mark_broken if fetch else _ignore,
        )
        if rank_actors.poll_interval is not None:
            self.poll = min(self.poll, rank_actors.poll_interval)
        #: The group's actors (not its executor): the Ray they belong to, names and nodes, whether it shut down.
        self.rank_actors = rank_actors
        self.refs = refs
        self.submitted = time.monotonic()
        self._fetch = fetch
        self._copy = rank_actors.isolate and not call.results_are_copied
        self._fast_tried = not fetch
        self._pings: dict[int, tuple[Any, float]] = {}
        #: When each waiting rank was last pinged.  A dead actor fails its call's
        #: reference at once; pings only catch a rank that stopped answering, which
        #: ``death_timeout`` bounds, so a quarter of it between pings is enough
        #: (every poll was ~1 ms of driver CPU per rank per second; SCALING.md).
        self._pinged: dict[int, float] = {}
        #: When each rank last answered one (the silence ``death_timeout`` bounds).
        self._answered: dict[int, float] = {}
        self._ping_every = max(self.poll, self.death_timeout / 4)
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
            ready, rest = ray.wait(refs, num_returns=1, timeout=left, fetch_local=self._fetch)
            if not ready:
                return
            if rest:  # take whatever else landed meanwhile in the same round
                more, _ = ray.wait(rest, num_returns=len(rest), timeout=0, fetch_local=self._fetch)
                ready += more
            landed = set(ready)
            self._take([p for p, ref in zip(waiting, refs, strict=True) if ref in landed])
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
        if not self._fetch:
            for position in positions:
                self.deliver(position, True, None)
            return
        ray = self.rank_actors.ray
        try:
            values = ray.get([self.refs[p] for p in positions])
        except Exception:  # noqa: BLE001 - find which rank it was
            for position in positions:
                try:
                    value = ray.get(self.refs[position])
                except Exception as exc:  # noqa: BLE001
                    self.rank_died(position, self._gone(position, exc))
                else:
                    self._accept(position, value)
            return
        for position, value in zip(positions, values, strict=True):
            self._accept(position, value)

    def _accept(self, position: int, value: Any) -> None:
        """Deliver one stored result: an atom as it is, a packed value unpacked, a failure as such."""
        rank = self.call.ranks[position]
        self.deliver(position, *_payload.decode_result(value, copy=self._copy, rank=rank, method=self.call.method))

    def done(self) -> bool:
        if RankCallHandle.done(self):
            return True
        refs = [self.refs[p] for p in self.waiting_positions()]
        ready, _ = self.rank_actors.ray.wait(refs, num_returns=len(refs), timeout=0, fetch_local=False)
        return len(ready) == len(refs)

    def fetched_any(self) -> bool:
        """Whether some result was already brought to the driver."""
        return self._fetch and len(self.waiting_positions()) < len(self.refs)

    def readiness(self) -> RayCallHandle:
        """A handle that waits, within what is left of this call's bound, until every
        result is stored, fetching none; its failures leave the group as it is."""
        bound = self.call.timeout
        left = None if bound is None else max(1e-3, bound - (time.monotonic() - self.submitted))
        n = len(self.refs)
        probe = Call(self.call.method, self.call.ranks, [()] * n, [{}] * n, timeout=left)
        return RayCallHandle(self.rank_actors, probe, self.refs, fetch=False)

    # -- liveness ----------------------------------------------------------------
    def check_alive(self, waiting: list[int]) -> None:
        """Ping ranks still running; a failed ping, or none answered within ``death_timeout``, is a death."""
        group = self.rank_actors
        if group.closed:
            return  # its actors are gone: their references fail, which the waits see
        ray = group.ray
        now = time.monotonic()
        sent = [self._pings[p][0] for p in waiting if p in self._pings]
        answered = set(ray.wait(sent, num_returns=len(sent), timeout=0)[0]) if sent else set()
        for position in waiting:
            ping = self._pings.get(position)
            if ping is not None:
                ref, since = ping
                if ref in answered:
                    try:
                        ray.get(ref)
                    except Exception as exc:  # noqa: BLE001
                        self.rank_died(position, self._gone(position, exc))
                        continue
                    ping = None
                    self._answered[position] = now
                elif now - self._answered.get(position, since) > self.death_timeout:
                    rank = self.call.ranks[position]
                    self.rank_died(
                        position,
                        f"its Ray actor {group.actor_name(rank)!r} on {group.node_of(rank)} has not "
                        f"answered a liveness ping for {self.death_timeout:g} s (death_timeout)",
                    )
                    continue
            if ping is None:
                self._pings.pop(position, None)
                if now - self._pinged.get(position, -float("inf")) < self._ping_every:
                    continue
                actor = group.actor(self.call.ranks[position])
                self._pings[position] = (actor.ping.options(concurrency_group=CONTROL_GROUP).remote(), now)
                self._pinged[position] = now

    def _gone(self, position: int, exc: BaseException) -> str:
        rank = self.call.ranks[position]
        name, node = self.rank_actors.actor_name(rank), self.rank_actors.node_of(rank)
        return f"its Ray actor {name!r} on {node} is gone ({type(exc).__name__}: {_first_line(exc)})"


def _ignore(reason: str) -> None:
    """``on_broken`` of a readiness probe: the real handle reports what happened."""


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else ""
