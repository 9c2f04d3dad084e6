"""Lazy results' rows, moved process to process, never through the driver (docs/lazy-results.md).

Every process of a world that hosts workers (the driver too, under the
launcher) runs one :class:`RowPlane`; the driver's own reads and frees are
the core's beside calls on the lane.  Requests and reply headers are small
messages on the processes' links to the driver (``_post``, relayed by
``_hub``); the rows' bytes go rank to rank over gloo into buffers made for
them (raw tensor bytes).  A data thread answers requests with
:func:`~dispatchcore.executor.take_kept_rows` (posting the rows' tensors
before the reply that names their tags), beside any call, so a busy process
still serves its rows; :meth:`RowPlane.fetch` asks every producer first,
then receives the answers as they come, one fetch at a time per process.
Another world's rows come the same way over bridges (``_bridge_rows``).  A
producer that is gone is answered for by the driver (``dead``), a world
that stops likewise (``stopped``): no store is watched.
"""

from __future__ import annotations

import functools
import itertools
import queue
import threading
from collections.abc import Sequence
from typing import Any

import torch.distributed as dist

from dispatchcore import DataProto, DispatchError, WorkerDiedError
from dispatchcore.executor import RowRequest, SendReaper, WorkerHost, peer_error, take_kept_rows

from ._bridge_rows import BridgeLane, RowBridges
from ._env import set_local_device
from ._post import Address, Post
from ._protocol import transport_key
from ._transport import RowTagCounter, Transport, post_recvs, post_sends
from ._wire import Header, pack, unpack

#: Kinds the data thread serves in order, and the answers a fetch waits for.
_SERVED = ("fetch", "transport")
_ANSWERS = ("rows", "failed", "dead", "stopped")


class RowPlane:
    """One process's row traffic: the data thread serving its kept rows, and its fetches."""

    def __init__(self, post: Post, store: dist.Store, transport: Transport) -> None:
        self._post = post
        #: The world's store: rendezvous of the bridges to other worlds, and the transport's join flags.
        self._store = store
        self._transport = transport
        self.rank = transport.rank
        self.world = post.address[0]
        self._tags = RowTagCounter()
        self._reaper = SendReaper(f"dispatchcore-row-reaper{self.rank}")
        self._fetch_lock = threading.Lock()
        self._fetch_ids = itertools.count()
        self._replies: dict[int, queue.SimpleQueue[tuple[Address, tuple[Any, ...]]]] = {}
        self._home = _HomeLane(self)
        #: Per other world fetched from: its bridges.
        self._lanes: dict[str, BridgeLane] = {}
        self._bridges: RowBridges | None = None
        self._bridges_lock = threading.Lock()
        self._work: queue.SimpleQueue[tuple[Address, tuple[Any, ...]] | None] = queue.SimpleQueue()
        self._closed = False
        for kind in _SERVED:
            post.on(kind, lambda sender, message: self._work.put((sender, message)))
        for kind in _ANSWERS:
            post.on(kind, self._answered)
        self._thread = threading.Thread(target=self._serve, name=f"dispatchcore-rows{self.rank}", daemon=True)
        self._thread.start()

    # -- serving ------------------------------------------------------------------------
    def _serve(self) -> None:
        set_local_device()  # CUDA rows are sent from this thread
        while (item := self._work.get()) is not None:
            sender, message = item
            try:
                if message[0] == "transport":  # the world added processes (``SpawnedWorld.add_processes``)
                    # On a thread of its own: a member that died mid-grow leaves it waiting (until the
                    # transport's timeout), and rows keep being served on the earlier generations meanwhile.
                    threading.Thread(
                        target=self._rebuild, args=message[1:], name=f"dispatchcore-rebuild{self.rank}", daemon=True
                    ).start()
                elif message[3] is not None:  # a consumer in another world (``_bridge_rows``)
                    self.row_bridges().answer(self._post, self._store, sender, message)
                else:
                    self._answer(sender, message[1], message[2])
            except Exception:  # noqa: BLE001, S112 - the requester (or the world) is gone
                continue

    def _rebuild(self, generation: int, members: list[int]) -> None:
        """Join the row transport's next generation, then say so (a plain flag: the driver waits for every member)."""
        try:
            self._transport.rebuild(generation, members)
        except Exception as exc:  # noqa: BLE001 - the driver reports it, naming this process
            self._store.set(transport_key(generation, self.rank), f"{type(exc).__name__}: {exc}".encode())  # type: ignore[arg-type]
        else:
            self._store.set(transport_key(generation, self.rank), b"")  # type: ignore[arg-type]

    def _answer(self, requester: Address, fetch_id: int, requests: list[RowRequest]) -> None:
        """Post the requested rows to ``requester``, then tell it their header and tags."""
        try:
            packed = pack([take_kept_rows(request) for request in requests])
            first = self._tags.take(packed.header.tags)
            generation, peer, groups = self._transport.link(self.rank, requester[1])
            works = post_sends(packed, peer, first, self._tags, groups)
        except Exception as exc:  # noqa: BLE001 - e.g. the rows were freed: the consumer raises it
            self._post.send(requester, ("failed", fetch_id, f"{type(exc).__name__}: {exc}"))
            return
        self._reaper.add(works, packed)
        self._post.send(requester, ("rows", fetch_id, packed.header, first, generation))

    # -- fetching -----------------------------------------------------------------------
    def equip(self, host: WorkerHost, death_timeout: float) -> None:
        """Have a rank's host fetch rows through this plane (into fresh receive buffers: private rows)."""
        host.fetch_rows = functools.partial(self.fetch, death_timeout=death_timeout)
        host.fetched_rows_private = True

    def fetch(self, requests: Sequence[RowRequest], death_timeout: float) -> list[DataProto]:
        """``WorkerHost.fetch_rows``: each request's rows, from the processes keeping them (other worlds' over bridges).

        ``death_timeout`` (the consuming group's) bounds the bridges to a silent producer.
        """
        out: list[DataProto | None] = [None] * len(requests)
        plan: dict[str, dict[int, list[int]]] = {}
        for i, request in enumerate(requests):
            world, d = str(request.address[0]), int(request.address[1])
            if world == self.world and d == self.rank:  # kept here after all (or freed: this raises saying so)
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

    def _fetch_from(
        self, world: str, requests: Sequence[RowRequest], by_process: dict[int, list[int]], bound: float
    ) -> dict[int, list[DataProto]]:
        """One world's share of a fetch: a request to each producing process first, then every answer."""
        producers = {d: requests[index[0]].rank for d, index in by_process.items()}  # group ranks, for errors
        lane = self._lane(world, requests[next(iter(by_process.values()))[0]].address, bound)
        fetch_id = next(self._fetch_ids)
        replies = self._replies[fetch_id] = queue.SimpleQueue()
        try:
            for d, index in by_process.items():
                ask = ("fetch", fetch_id, [requests[i] for i in index], lane.ask(d, bound))
                try:
                    self._post.send((world, d), ask)
                except OSError as exc:  # the link to the driver is gone: so is this world
                    raise DispatchError(f"lost the link to the driver while fetching rows ({exc})") from exc
            return self._receive(lane, replies, producers)
        finally:
            del self._replies[fetch_id]

    def _lane(self, world: str, address: Any, bound: float) -> Any:
        """The way to ``world``'s rows: this world's transport, or bridges to another (made on first use)."""
        if world == self.world:
            return self._home
        lane = self._lanes.get(world)
        if lane is None:
            lane = self._lanes[world] = BridgeLane(self.row_bridges(), address[2], bound)
        return lane

    def row_bridges(self) -> RowBridges:
        """This process's bridges to other worlds (serving and fetching), made on first use."""
        with self._bridges_lock:
            if self._bridges is None:
                self._bridges = RowBridges(self.rank)
            return self._bridges

    def _answered(self, sender: Address, message: tuple[Any, ...]) -> None:
        """A reply for fetch ``message[1]`` (on the link's reader thread); an abandoned fetch's rows are drained."""
        replies = self._replies.get(message[1])
        if replies is not None:
            replies.put((sender, message))
        elif message[0] == "rows":
            lane = self._home if sender[0] == self.world else self._lanes.get(sender[0])
            if lane is not None:
                threading.Thread(target=_drain, args=(lane, sender[1], *message[2:]), daemon=True).start()

    def _receive(
        self, lane: Any, replies: queue.SimpleQueue[tuple[Address, tuple[Any, ...]]], producers: dict[int, int]
    ) -> dict[int, list[DataProto]]:
        """Post the receives of each producer's rows as its answer comes; then wait for all of them."""
        posted: dict[int, tuple[Header, list[Any], list[Any], list[Any]]] = {}
        waiting, error = set(producers), None
        while waiting and error is None:
            (world, d), message = replies.get()
            waiting.discard(d)
            error = self._reply_error(lane, world, d, message, producers, posted)
        answers: dict[int, list[DataProto]] = {}
        for d, (header, buffers, device, works) in posted.items():  # always waited: they hold buffers
            try:
                for work in works:
                    work.wait()
                answers[d] = unpack(header, buffers, device)
            except Exception as exc:  # noqa: BLE001 - a torn connection: the producer died mid-transfer
                lane.failed(d)
                error = error or _died(producers[d], exc)
        if error is not None:
            raise error
        return answers

    def _reply_error(
        self, lane: Any, world: str, d: int, message: tuple[Any, ...], producers: dict[int, int], posted: dict[int, Any]
    ) -> BaseException | None:
        """Act on one reply: post the receives of its rows, or the error it brings."""
        kind = message[0]
        if kind == "rows":
            header, first, generation = message[2:]
            try:
                posted[d] = (header, *lane.post_recv(d, header, first, generation))
            except Exception as exc:  # noqa: BLE001 - a torn connection (or a bridge never built)
                lane.failed(d)
                return _died(producers[d], exc)
            return None
        if kind == "failed":
            return DispatchError(f"rank {producers[d]} could not send the rows it keeps: {message[2]}")
        if kind == "dead":
            return WorkerDiedError(producers[d], f"{message[2]} (seen while fetching the rows it keeps)")
        if world != self.world:
            lane = self._lanes.pop(world, None)
            if lane is not None:
                lane.close()
        return DispatchError("the driver stopped the torchrun world while rows were being fetched")

    # -- stopping -----------------------------------------------------------------------
    def close(self, timeout: float = 1.0) -> None:
        """End the data thread and every waiting fetch; wait up to ``timeout`` s for rows being sent."""
        if self._closed:
            return
        self._closed = True
        self._work.put(None)
        for fetch_id, replies in list(self._replies.items()):
            replies.put(((self.world, -1), ("stopped", fetch_id)))
        self._thread.join(timeout)
        for lane in self._lanes.values():
            lane.close()
        self._lanes.clear()
        self._reaper.drain(timeout)
        self._reaper.close()
        if self._bridges is not None:
            self._bridges.close(timeout)
        self._store = None  # type: ignore[assignment]  # its connection goes now, even while the plane is referenced


class _HomeLane:
    """This world's rows: the world's transport carries them."""

    def __init__(self, plane: RowPlane) -> None:
        self._plane = plane

    def ask(self, d: int, bound: float) -> None:
        """What a request to ``d`` adds (nothing: the transport is already shared)."""
        return None

    def post_recv(self, d: int, header: Header, first: int, generation: int) -> tuple[list[Any], list[Any], list[Any]]:
        plane = self._plane
        _, peer, groups = plane._transport.link(d, plane.rank, generation)
        return post_recvs(header, peer, first, plane._tags, groups)

    def failed(self, d: int) -> None:
        """Nothing to drop: the world's transport is shared, and a dead process is known to the driver."""

    def close(self) -> None:
        """Nothing to let go of."""


def _drain(lane: Any, d: int, header: Header, first: int, *extra: Any) -> None:
    """Receive and drop rows an abandoned fetch asked for, so their sender is not left waiting."""
    try:
        for work in lane.post_recv(d, header, first, *extra)[2]:
            work.wait()
    except Exception:  # noqa: BLE001 - the producer is gone
        lane.failed(d)


def _died(rank: int, exc: BaseException) -> WorkerDiedError:
    return WorkerDiedError(rank, f"its process is gone (rows lost mid-transfer: {peer_error(exc)})")
