"""Lazy results' rows, moved process to process, never through the driver (docs/lazy-results.md).

Every process of a world that hosts workers (the driver too, for its column
reads) runs one :class:`RowPlane`: a data thread answers the requests on its
``rows/<data rank>`` queue with :func:`~dispatchcore.executor.take_kept_rows`
(posting the rows' tensors before the reply that names their tags), beside
any call, so a busy process still serves its rows; :meth:`RowPlane.fetch`
asks every producer first, then receives the answers as they come, one
fetch at a time per process.  Another world's rows come the same way through
a ``BridgeLane`` (``_bridge_rows``).  While a fetch waits, a watcher reads the
producers' ``dead/<rank>`` marks (set by the driver when a group's lane
finds a process gone) and the world's ``stopping`` mark: either ends the wait.
"""

from __future__ import annotations

import functools
import itertools
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch.distributed as dist

from dispatchcore import DataProto, DispatchError, WorkerDiedError
from dispatchcore.executor import (
    RowRequest,
    WorkerHost,
    free_kept_rows,
    liveness_poll,
    take_kept_rows,
)

from ._bridge_rows import BridgeLane, RowBridges, WorldStore
from ._env import set_local_device
from ._protocol import STOPPING_KEY, dead_key, encode, home_of, pop, rows_key, rows_reply_key, transport_key
from ._transport import RowTagCounter, SendReaper, Transport, peer_error, post_recvs, post_sends
from ._wire import Header, pack, unpack


class RowPlane:
    """One process's row traffic: the data thread serving its kept rows, and its fetches."""

    def __init__(self, store: dist.Store, transport: Transport) -> None:
        self._store = store
        self._transport = transport
        self.rank = transport.rank
        self._tags = RowTagCounter()
        self._reaper = SendReaper(f"dispatchcore-row-reaper{self.rank}")
        self._fetch_lock = threading.Lock()
        self._fetch_ids = itertools.count()
        #: ``(host, port)`` of this world's store: a row address naming another is another world's.
        self._home = home_of(store)
        #: Per world fetched from (``None``: this one): its lane and the watcher of its producers.
        self._lanes: dict[WorldStore | None, tuple[Any, _Watch]] = {}
        self._bridges: RowBridges | None = None
        self._bridges_lock = threading.Lock()
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name=f"dispatchcore-rows{self.rank}", daemon=True)
        self._thread.start()

    # -- serving ------------------------------------------------------------------------
    def _serve(self) -> None:
        set_local_device()  # CUDA rows are sent from this thread
        try:
            store = self._store.clone()  # type: ignore[attr-defined]  # Store.clone is missing from torch's stubs
        except Exception:  # noqa: BLE001 - the store is gone: nothing to serve
            return
        key = rows_key(self.rank)
        while True:
            try:
                message = pop(store, key)
            except Exception:  # noqa: BLE001 - the store went away: the world is over
                return
            if message[0] == "quit":
                return
            if message[0] == "bridge":  # a consumer in another world (``_bridge_rows``)
                try:
                    self.row_bridges().answer(store, message)
                except Exception:  # noqa: BLE001, S110 - the requester (or the store) is gone
                    pass
                continue
            if message[0] == "free":
                free_kept_rows(message[1])
                continue
            if message[0] == "transport":  # the world added processes (``SpawnedWorld.add_processes``)
                self._rebuild(store, *message[1:])
                continue
            _, requester, fetch_id, requests = message
            try:
                self._answer(store, requester, fetch_id, requests)
            except Exception:  # noqa: BLE001, S112 - the requester (or the store) is gone
                continue

    def _rebuild(self, store: dist.Store, generation: int, members: list[int]) -> None:
        """Join the row transport's next generation, then say so (the driver waits for every member)."""
        try:
            self._transport.rebuild(generation, members)
        except Exception as exc:  # noqa: BLE001 - the driver reports it, naming this process
            store.set(transport_key(generation, self.rank), f"{type(exc).__name__}: {exc}".encode())  # type: ignore[arg-type]
        else:
            store.set(transport_key(generation, self.rank), b"")  # type: ignore[arg-type]

    def _answer(self, store: dist.Store, requester: int, fetch_id: int, requests: list[RowRequest]) -> None:
        """Post the requested rows to ``requester``, then tell it their header and tags."""
        reply = rows_reply_key(requester)
        try:
            packed = pack([take_kept_rows(request) for request in requests])
            first = self._tags.take(packed.header.tags)
            generation, peer, groups = self._transport.link(self.rank, requester)
            works = post_sends(packed, peer, first, self._tags, groups)
        except Exception as exc:  # noqa: BLE001 - e.g. the rows were freed: the consumer raises it
            store.queue_push(reply, encode(("failed", fetch_id, self.rank, f"{type(exc).__name__}: {exc}")))
            return
        self._reaper.add(works, packed)
        store.queue_push(reply, encode(("rows", fetch_id, self.rank, packed.header, first, generation)))

    def free(self, process: int, keys: Sequence[str]) -> None:
        """Have process ``process``'s data thread drop ``keys`` now, even while it is busy in a call."""
        self._store.queue_push(rows_key(process), encode(("free", list(keys))))

    # -- fetching -----------------------------------------------------------------------
    def equip(self, host: WorkerHost, death_timeout: float) -> None:
        """Have a rank's host fetch rows through this plane (into fresh receive buffers: private rows)."""
        host.fetch_rows = functools.partial(self.fetch, death_timeout=death_timeout)
        host.fetched_rows_private = True

    def fetch(self, requests: Sequence[RowRequest], death_timeout: float) -> list[DataProto]:
        """``WorkerHost.fetch_rows``: each request's rows, from the processes keeping them (other worlds' over bridges).

        ``death_timeout`` (the consuming group's) bounds the wait on a silent producer.
        """
        out: list[DataProto | None] = [None] * len(requests)
        plan: dict[WorldStore | None, dict[int, list[int]]] = {}
        for i, request in enumerate(requests):
            world, d = self._world_of(request.address), int(request.address[1])
            if world is None and d == self.rank:  # kept here after all (or freed: this raises saying so)
                out[i] = take_kept_rows(request)
            else:
                plan.setdefault(world, {}).setdefault(d, []).append(i)
        if plan:
            with self._fetch_lock:
                if self._closed:
                    raise DispatchError("this process is leaving: its torchrun world was stopped")
                for world, by_process in plan.items():
                    answers = self._fetch_from(world, requests, by_process, death_timeout)
                    for d, index in by_process.items():
                        for i, part in zip(index, answers[d], strict=True):
                            out[i] = part
        return [part for part in out if part is not None]

    def _world_of(self, address: Any) -> WorldStore | None:
        """The other world an address names, or ``None`` for this process's own world."""
        world = address[2] if len(address) > 2 else None
        if world is None or (world.host, world.port) == self._home:
            return None
        return world  # type: ignore[no-any-return]

    def _fetch_from(
        self, world: WorldStore | None, requests: Sequence[RowRequest], by_process: dict[int, list[int]], bound: float
    ) -> dict[int, list[DataProto]]:
        """One world's share of a fetch: a request to each producing process first, then every answer."""
        producers = {d: requests[index[0]].rank for d, index in by_process.items()}  # group ranks, for errors
        lane, watch = self._lane(world, producers, bound)
        fetch_id = next(self._fetch_ids)
        try:
            for d, index in by_process.items():
                lane.request(d, fetch_id, [requests[i] for i in index], bound)
        except Exception as exc:  # noqa: BLE001 - the producing world's store is gone
            self._drop_lane(world)
            raise _unreachable(producers, exc) from exc
        watched = watch.begin(fetch_id, producers, bound)
        try:
            return self._receive(lane, watched)
        finally:
            watch.end()

    def _lane(self, world: WorldStore | None, producers: dict[int, int], bound: float) -> tuple[Any, _Watch]:
        """The way to ``world``'s rows (made on first use) and the watcher of its producers."""
        entry = self._lanes.get(world)
        if entry is None:
            lane: _HomeLane | BridgeLane
            try:
                if world is None:
                    lane = _HomeLane(self)
                    watch = _Watch(self._store.clone(), lane.key)  # type: ignore[attr-defined]
                else:
                    self._prune()
                    lane = BridgeLane(self.row_bridges(), world, bound)
                    watch = _Watch(lane.connect(), lane.key, home=self._store.clone())  # type: ignore[attr-defined]
            except Exception as exc:  # noqa: BLE001 - the store (this world's, or the producers') is gone
                raise _unreachable(producers, exc) from exc
            entry = self._lanes[world] = (lane, watch)
        return entry

    def _prune(self) -> None:
        """Drop the lanes to other worlds that have stopped (their connections and watchers go with them)."""
        for world, (lane, _) in list(self._lanes.items()):
            if world is None:
                continue
            try:
                gone = lane.store.check([STOPPING_KEY])
            except Exception:  # noqa: BLE001 - its store is gone
                gone = True
            if gone:
                self._drop_lane(world)

    def _drop_lane(self, world: WorldStore | None) -> None:
        entry = self._lanes.pop(world, None)
        if entry is not None:
            entry[1].close()
            entry[0].close()

    def row_bridges(self) -> RowBridges:
        """This process's bridges to other worlds (serving and fetching), made on first use."""
        with self._bridges_lock:
            if self._bridges is None:
                self._bridges = RowBridges(self.rank)
            return self._bridges

    def _receive(self, lane: Any, watched: _Watched) -> dict[int, list[DataProto]]:
        """Post the receives of each producer's rows as its answer comes; then wait for all of them."""
        posted: dict[int, tuple[Header, list[Any], list[Any], list[Any]]] = {}
        error: BaseException | None = None
        while watched.pending() and error is None:
            try:
                message = pop(lane.replies, lane.key)
            except Exception as exc:  # noqa: BLE001 - the store is gone: the world is over
                error = DispatchError(f"lost the store connection while fetching rows ({exc})")
                break
            kind, fetch_id = message[0], message[1]
            if fetch_id != watched.fetch_id:  # left over from a fetch that ended early
                if kind == "rows":
                    _drain(lane, *message[2:])
                continue
            if kind == "rows":
                d, header, first, *extra = message[2:]
                try:
                    posted[d] = (header, *lane.post_recv(d, header, first, *extra))
                except Exception as exc:  # noqa: BLE001 - a torn connection (or a bridge never built)
                    lane.failed(d)
                    error = _died(watched.producers[d], exc)
                watched.answered(d)
            elif kind == "failed":
                _, _, d, text = message
                error = DispatchError(f"rank {watched.producers[d]} could not send the rows it keeps: {text}")
            elif kind == "dead":
                _, _, d, detail = message
                error = WorkerDiedError(watched.producers[d], f"{detail} (seen while fetching the rows it keeps)")
            elif kind == "stopped":
                error = DispatchError("the driver stopped the torchrun world while rows were being fetched")
        answers: dict[int, list[DataProto]] = {}
        for d, (header, buffers, device, works) in posted.items():  # always waited: they hold buffers
            try:
                for work in works:
                    work.wait()
                answers[d] = unpack(header, buffers, device)
            except Exception as exc:  # noqa: BLE001 - a torn connection: the producer died mid-transfer
                lane.failed(d)
                error = error or _died(watched.producers[d], exc)
        if error is not None:
            raise error
        return answers

    # -- stopping -----------------------------------------------------------------------
    def close(self, timeout: float = 1.0) -> None:
        """End the data thread and the watcher; wait up to ``timeout`` s for rows being sent."""
        if self._closed:
            return
        self._closed = True
        try:
            self._store.queue_push(rows_key(self.rank), encode(("quit",)))
        except Exception:  # noqa: BLE001, S110 - the store is gone: so is the data thread's pop
            pass
        self._thread.join(timeout)
        for world in list(self._lanes):
            self._drop_lane(world)  # their store connections go with them
        self._reaper.drain(timeout)
        self._reaper.close()
        if self._bridges is not None:
            self._bridges.close(timeout)


class _HomeLane:
    """This world's rows: a request on each producer's queue, answers on this process's, the world's transport."""

    def __init__(self, plane: RowPlane) -> None:
        self._plane = plane
        self.key = rows_reply_key(plane.rank)
        self.replies = plane._store.clone()  # type: ignore[attr-defined]  # the connection fetches wait on

    def request(self, d: int, fetch_id: int, requests: list[RowRequest], death_timeout: float) -> None:
        self._plane._store.queue_push(rows_key(d), encode(("fetch", self._plane.rank, fetch_id, requests)))

    def post_recv(self, d: int, header: Header, first: int, generation: int) -> tuple[list[Any], list[Any], list[Any]]:
        plane = self._plane
        _, peer, groups = plane._transport.link(d, plane.rank, generation)
        return post_recvs(header, peer, first, plane._tags, groups)

    def failed(self, d: int) -> None:
        """Nothing to drop: the world's transport is shared, and a dead process is marked by the driver."""

    def close(self) -> None:
        self.replies = None


def _drain(lane: Any, d: int, header: Header, first: int, *extra: Any) -> None:
    """Receive and drop rows an abandoned fetch asked for, so their sender is not left waiting."""
    try:
        for work in lane.post_recv(d, header, first, *extra)[2]:
            work.wait()
    except Exception:  # noqa: BLE001 - the producer is gone
        lane.failed(d)


def _unreachable(producers: dict[int, int], exc: BaseException) -> DispatchError:
    ranks = sorted(producers.values())
    return DispatchError(f"cannot reach the torchrun world keeping the rows of rank(s) {ranks} (shut down?): {exc}")


def _died(rank: int, exc: BaseException) -> WorkerDiedError:
    return WorkerDiedError(rank, f"its process is gone (rows lost mid-transfer: {peer_error(exc)})")


@dataclass
class _Watched:
    """The fetch in flight: which producers (data rank -> group rank) it still waits for."""

    fetch_id: int
    producers: dict[int, int]
    death_timeout: float
    waiting: set[int] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def pending(self) -> bool:
        with self.lock:
            return bool(self.waiting)

    def answered(self, d: int) -> None:
        with self.lock:
            self.waiting.discard(d)

    def awaited(self) -> list[int]:
        with self.lock:
            return sorted(self.waiting)


class _Watch:
    """The watcher thread of one process: ends a fetch's wait when a producer it awaits is gone."""

    def __init__(self, store: dist.Store, reply_key: str, home: dist.Store | None = None) -> None:
        """``store``: the producers' world's; ``home``: this process's own, when that is another world."""
        self._store = store
        self._home = home
        self._reply_key = reply_key
        self._cond = threading.Condition()
        self._current: _Watched | None = None
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="dispatchcore-row-watch", daemon=True)
        self._thread.start()

    def begin(self, fetch_id: int, producers: dict[int, int], death_timeout: float) -> _Watched:
        watched = _Watched(fetch_id, dict(producers), death_timeout, set(producers))
        with self._cond:
            self._current = watched
            self._cond.notify_all()
        return watched

    def end(self) -> None:
        with self._cond:
            self._current = None
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(1.0)

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._current is None and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                watched = self._current
                assert watched is not None  # noqa: S101 - the loop above
            verdict = self._check(watched)
            if verdict is not None:
                with self._cond:
                    if self._current is watched:  # still waiting: wake it
                        self._current = None
                        try:
                            self._store.queue_push(self._reply_key, encode(verdict))
                        except Exception:  # noqa: BLE001, S110 - the store is gone: the fetch sees that itself
                            pass
                continue
            with self._cond:
                if self._current is watched and not self._closed:
                    self._cond.wait(liveness_poll(watched.death_timeout))

    def _check(self, watched: _Watched) -> tuple[Any, ...] | None:
        """The message that ends ``watched``'s wait, or ``None`` while every awaited producer lives."""
        store = self._store
        try:
            if store.check([STOPPING_KEY]) or (self._home is not None and self._home.check([STOPPING_KEY])):
                return ("stopped", watched.fetch_id)
            for d in watched.awaited():
                if store.check([dead_key(d)]):
                    detail = bytes(store.get(dead_key(d))).decode(errors="replace")
                    return ("dead", watched.fetch_id, d, detail)
        except Exception:  # noqa: BLE001, S110 - the store is gone: the fetch's own wait on it fails too
            pass
        return None
