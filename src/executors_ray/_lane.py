"""The driver's end of a Ray group's control lane: calls and small results on one socket per rank actor.

Every Ray actor call costs about 1 ms (task submission, scheduling, the
result's round trip through the owner), so a small ``wg.m()`` on Ray cost
what a Ray call costs.  Once a group's actors are up, each joins the lane
(:mod:`dispatchcore.executor`'s shared part): the driver opens a door on the
interface Ray itself uses (loopback when every actor shares the driver's
node), hands each actor the address and token as the argument of one Ray
call (Ray is the :class:`~dispatchcore.executor.LaneDirectory` here), and
from then on calls go out as framed objects on the link and results come
back the same way (arrays out of band, into private memory: no copy for
isolation).  Ray keeps placement, resources, lifetimes, rows served actor
to actor and weight transfers.  Values holding object references (a
forwarded future's chunk, an ``ObjectRef`` argument) ride a Ray task of
their own (``stash``) that Ray resolves; the call itself still goes on the
lane, so calls keep their order.

Each actor has two links to the driver (``_lane_rank``): calls and their
answers on one, pings, cancels and stash failures on the other.  One reader
thread per group watches every link of the group with a selector, so
answers from N ranks wake one thread, not N.

Liveness: a link that ends fails every call waiting on that rank at once
(the actor's process is gone); a rank that stops answering lane pings for
``death_timeout`` is given up (the one liveness rule, with Ray's word that
an actor died).  One door per group,
open only while its actors connect; each group's links are its own.
"""

from __future__ import annotations

import itertools
import queue
import secrets
import selectors
import socket
import threading
import time
from collections.abc import Sequence
from typing import Any

from dispatchcore import DispatchError
from dispatchcore.executor import Call, LaneLink, RankCallHandle, open_lane, unframe_object

from . import _payload
from ._rank_actors import RankActors
from ._tags import CONTROL_GROUP, CONTROL_LINK, ROWS_GROUP, Layout


class LaneCallHandle(RankCallHandle):
    """One call on the lane: the rank links' readers deliver; the base owns every bound."""

    def __init__(self, lane: RayLane, call: Call) -> None:
        super().__init__(call, death_timeout=lane.rank_actors.death_timeout, on_broken=lane.rank_actors.mark_broken)
        if lane.rank_actors.poll_interval is not None:
            self.poll = min(self.poll, lane.rank_actors.poll_interval)
        self.lane = lane
        #: The stash tasks of this call's ranks (position -> (key, ref)), watched for failure.
        self.stashes: dict[int, tuple[Any, Any]] = {}
        #: Results kept in the object store (position -> the ``take_result`` reference holding it).
        self.kept: dict[int, Any] = {}

    def stored_results(self) -> list[Any] | None:
        """Once the call ended well: a reference per rank if every result went by the object store, else ``None``."""
        try:
            self.result()
        except DispatchError:
            return None
        if len(self.kept) != len(self.call.ranks):
            return None
        return [self.kept[p] for p in range(len(self.call.ranks))]

    def accept(self, position: int, result: Any, from_store: bool = False) -> None:
        """A rank's answer as ``RankActor.call`` returns it; the lane's is private memory, the store's is shared."""
        copy = from_store and self.lane.rank_actors.isolate and not self.call.results_are_copied
        ok, value = _payload.decode_result(result, copy=copy, rank=self.call.ranks[position], method=self.call.method)
        self.deliver(position, ok, value)

    def check_alive(self, waiting: list[int]) -> None:
        if self.stashes:
            self.lane.watch_stashes(self, waiting)
        for position in waiting:
            detail = self.lane.silent(self.call.ranks[position], self.death_timeout)
            if detail is not None:
                self.rank_died(position, detail)


class _RankLink:
    """One rank's two links, its calls awaiting answers and what its pings say."""

    def __init__(self, rank: int, link: LaneLink, control: LaneLink) -> None:
        self.rank = rank
        self.link = link
        self.control = control
        self.pending: dict[int, tuple[LaneCallHandle, int]] = {}
        self.lock = threading.Lock()
        self.ended: str | None = None
        self.unanswered_since: float | None = None
        self.last_ping = 0.0
        self.pings = itertools.count()


class RayLane:
    """A Ray group's lane: a link per rank actor, a reader thread per link."""

    def __init__(self, rank_actors: RankActors, host: str, connect_timeout: float, inline_max: int) -> None:
        self.rank_actors = rank_actors
        self.host = host
        self._inline_max = inline_max
        self._connect_timeout = connect_timeout
        self._links: dict[int, _RankLink] = {}
        self._cids = itertools.count()
        self._reader = _Reader(self)
        #: Names this driver's stash keys apart from another driver's on a shared (detached) actor.
        self._id = secrets.token_hex(4)

    # -- joining -------------------------------------------------------------------
    def connect(self, ranks: Sequence[int]) -> None:
        """Have each of ``ranks``' actors join; raises ``RuntimeError``/``TimeoutError`` if one cannot."""
        ray, actors = self.rank_actors.ray, self.rank_actors.actors
        with open_lane(self.host) as door:
            address = door.address.encode()
            joins = {
                rank: actors[rank]
                .join_lane.options(concurrency_group=CONTROL_GROUP)
                .remote(address, rank, self._connect_timeout, self._inline_max)
                for rank in ranks
            }

            def gone(rank: int) -> str | None:
                ready, _ = ray.wait([joins[rank]], timeout=0)
                if not ready:
                    return None
                try:
                    return ray.get(ready[0]) or None
                except Exception as exc:  # noqa: BLE001 - the actor died
                    return f"{type(exc).__name__}: {exc}"

            expected = [*ranks, *(rank | CONTROL_LINK for rank in ranks)]
            links = door.accept(expected, self._connect_timeout, lambda who: gone(who & ~CONTROL_LINK))
        for rank in ranks:
            old = self._links.get(rank)
            entry = self._links[rank] = _RankLink(rank, links[rank], links[rank | CONTROL_LINK])
            if old is not None:
                _end(old, f"rank {rank}'s actor was replaced")
            self._reader.add(entry)

    def has(self, ranks: Sequence[int]) -> bool:
        return all(rank in self._links for rank in ranks)

    # -- calls ---------------------------------------------------------------------
    def submit(self, call: Call, tasks: Sequence[tuple[Layout, list[Any]]]) -> LaneCallHandle:
        """Send each rank its ``(layout, top-level values)``; values holding references go by a stash task."""
        handle = LaneCallHandle(self, call)
        cid = next(self._cids)
        for position, (rank, (layout, tops)) in enumerate(zip(call.ranks, tasks, strict=True)):
            stash = None
            if tops:
                stash = (self._id, cid, position)
                actor = self.rank_actors.actors[rank]
                ref = actor.stash.options(concurrency_group=ROWS_GROUP).remote(stash, *tops)  # Ray resolves top refs
                handle.stashes[position] = (stash, ref)
            self._send(rank, cid, handle, position, ("call", cid, call.method, layout, None if tops else (), stash))
        return handle

    def _send(self, rank: int, cid: int, handle: LaneCallHandle, position: int, message: tuple[Any, ...]) -> None:
        entry = self._links[rank]
        with entry.lock:
            ended = entry.ended
            if ended is None:
                entry.pending[cid] = (handle, position)
        if ended is not None:
            handle.rank_died(position, ended)
            return
        try:
            entry.link.send_object(message)
        except OSError:
            pass  # the reader sees the link end and fails the call

    def cancel(self, ranks: Sequence[int], call_id: int) -> list[int]:
        """Ask ``ranks`` to stop call ``call_id`` on their links; the ranks that could not be asked."""
        missed = []
        for rank in ranks:
            entry = self._links.get(rank)
            try:
                if entry is None or entry.ended is not None:
                    raise OSError
                entry.control.send_object(("cancel", call_id))
            except OSError:
                missed.append(rank)
        return missed

    # -- liveness ------------------------------------------------------------------
    def silent(self, rank: int, death_timeout: float) -> str | None:
        """Why ``rank`` counts as gone (its link ended, or no pong for ``death_timeout``), else ``None``."""
        entry = self._links.get(rank)
        if entry is None:
            return None
        if entry.ended is not None:
            return entry.ended
        now = time.monotonic()
        since = entry.unanswered_since
        if since is not None and now - since > death_timeout:
            name, node = self.rank_actors.actor_name(rank), self.rank_actors.node_of(rank)
            silence = f"has not answered a liveness ping for {death_timeout:g} s (death_timeout)"
            return f"its Ray actor {name!r} on {node} {silence}"
        if now - entry.last_ping >= max(0.01, death_timeout / 4):
            entry.last_ping = now
            if since is None:
                entry.unanswered_since = now
            try:
                entry.control.send_object(("ping", next(entry.pings)))
            except OSError:
                pass
        return None

    def watch_stashes(self, handle: LaneCallHandle, waiting: list[int]) -> None:
        """Tell a rank when the task bringing its call's values failed (it waits for them otherwise)."""
        ray = self.rank_actors.ray
        for position in waiting:
            stash = handle.stashes.get(position)
            if stash is None:
                continue
            key, ref = stash
            ready, _ = ray.wait([ref], timeout=0)
            if not ready:
                continue
            del handle.stashes[position]
            try:
                ray.get(ready[0])
            except Exception as exc:  # noqa: BLE001 - e.g. a forwarded reference whose producer died
                entry = self._links.get(handle.call.ranks[position])
                if entry is not None:
                    try:
                        entry.control.send_object(("unstash", key, f"{type(exc).__name__}: {exc}"))
                    except OSError:
                        pass

    def on_message(self, entry: _RankLink, message: tuple[Any, ...]) -> None:
        """One message from ``entry``'s rank (on the reader thread)."""
        kind = message[0]
        if kind == "done":
            with entry.lock:
                waiter = entry.pending.pop(message[1], None)
            if waiter is not None:
                waiter[0].accept(waiter[1], message[2])
        elif kind == "kept":
            threading.Thread(
                target=self._take_kept, args=(entry.rank, entry, message[1], message[2]), daemon=True
            ).start()  # a Ray round trip and a large payload: not on the thread every rank's answers wait on
        elif kind == "pong":
            entry.unanswered_since = None

    def on_end(self, entry: _RankLink) -> None:
        """``entry``'s rank is gone (a link ended): fail what still waits on it."""
        name, node = self.rank_actors.actor_name(entry.rank), self.rank_actors.node_of(entry.rank)
        _end(entry, f"its Ray actor {name!r} on {node} is gone (its lane link to the driver closed)")

    def _take_kept(self, rank: int, entry: _RankLink, cid: int, key: Any) -> None:
        """Fetch a result only Ray can hand over (an object reference) with one task in the ``rows`` group."""
        with entry.lock:
            waiter = entry.pending.pop(cid, None)
        if waiter is None:
            return
        handle, position = waiter
        ray = self.rank_actors.ray
        try:
            ref = self.rank_actors.actors[rank].take_result.options(concurrency_group=ROWS_GROUP).remote(key)
            handle.kept[position] = ref  # what a consuming Ray group can read without the driver
            value = ray.get(ref, timeout=self.rank_actors.death_timeout)
        except Exception as exc:  # noqa: BLE001 - the actor died, or never answered
            name, node = self.rank_actors.actor_name(rank), self.rank_actors.node_of(rank)
            handle.rank_died(position, f"its Ray actor {name!r} on {node} is gone ({type(exc).__name__})")
            return
        handle.accept(position, value, from_store=True)

    def close(self, ranks: Sequence[int] | None = None) -> None:
        """Close the links of ``ranks`` (all by default); their readers fail what still waits."""
        for rank in list(self._links) if ranks is None else ranks:
            entry = self._links.pop(rank, None)
            if entry is not None:
                _end(entry, f"ray group's lane to rank {rank} was closed (shutdown or replacement)")
        if ranks is None:
            self._reader.stop()


def _end(entry: _RankLink, reason: str) -> None:
    """Close ``entry``'s links once and fail the calls still waiting on it with ``reason``."""
    with entry.lock:
        if entry.ended is not None:
            return
        entry.ended = reason
        pending, entry.pending = entry.pending, {}
    entry.link.close()
    entry.control.close()
    for handle, position in pending.values():
        handle.rank_died(position, reason)


class _Reader:
    """One thread reading every link of a group (a selector; a wake-up socket for new links and stop)."""

    def __init__(self, lane: RayLane) -> None:
        self._lane = lane
        self._added: queue.SimpleQueue[_RankLink | None] = queue.SimpleQueue()
        self._waker, self._wakee = socket.socketpair()
        self._waker.setblocking(False)
        self._wakee.setblocking(False)
        self._thread = threading.Thread(target=self._loop, name="dispatchcore-ray-lane", daemon=True)
        self._thread.start()

    def add(self, entry: _RankLink) -> None:
        self._added.put(entry)
        self._wake()

    def stop(self) -> None:
        self._added.put(None)
        self._wake()

    def _wake(self) -> None:
        try:
            self._waker.send(b"\0")
        except (BlockingIOError, OSError):
            pass

    def _loop(self) -> None:
        selector = selectors.DefaultSelector()
        selector.register(self._wakee, selectors.EVENT_READ, None)
        try:
            while True:
                for key, _ in selector.select():
                    if key.data is None:
                        if not self._take_added(selector):
                            return
                    else:
                        self._read(selector, *key.data)
        finally:
            selector.close()
            self._waker.close()
            self._wakee.close()

    def _take_added(self, selector: selectors.BaseSelector) -> bool:
        try:
            self._wakee.recv(4096)
        except BlockingIOError:
            pass
        while not self._added.empty():
            entry = self._added.get()
            if entry is None:
                return False
            for link in (entry.link, entry.control):
                fd = link.fileno()
                if fd < 0:
                    continue  # already closed again
                if fd in selector.get_map():  # a closed link's number, reused by this new one
                    selector.unregister(fd)
                selector.register(fd, selectors.EVENT_READ, (entry, link, fd))
        return True

    def _read(self, selector: selectors.BaseSelector, entry: _RankLink, link: LaneLink, fd: int) -> None:
        lane = self._lane
        messages = link.take_ready() if entry.ended is None else None
        for raw in messages or ():
            lane.on_message(entry, unframe_object(raw))
        if messages is None:
            for key in list(selector.get_map().values()):
                if key.data is not None and key.data[0] is entry:
                    selector.unregister(key.fd)
            lane.on_end(entry)
