"""Lazy rows between processes of two self-started worlds, over bridges (docs/lazy-results.md).

A consuming rank cannot use its own world's transport to reach another
world, but it reaches that world's store (a driver-hosted ``TCPStore`` on
loopback): the rows move over a two-rank gloo (NCCL for CUDA) group on a
``PrefixStore`` of it, unique to the pair, as weights do (``_bridge``).
Requests and answers are the in-world fetch's messages (``_protocol``), so
one loop and one watcher (``_row_plane``) serve both.  A pair's bridge is
named by the producer's data rank, the consumer process's bridge id (fresh
per process) and a generation the consumer bumps when a transfer on it
failed, so a replaced rank or a broken bridge never meets an old one's keys.
"""

from __future__ import annotations

import functools
import threading
import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from dispatchcore.executor import LOOPBACK, RowRequest, take_kept_rows

from ._protocol import FOREVER_S, encode, home_of, rows_key
from ._transport import RowTagCounter, SendReaper, pair_group, post_recvs, post_sends
from ._wire import Header, pack

#: Bridges are never given less than this bound (a busy machine must not look like a dead producer).
BRIDGE_FLOOR_S = 3.0

#: Identities of the self-started worlds running in this (driver) process; see :func:`world_started`.
_live_worlds: set[str] = set()
_live_lock = threading.Lock()


@dataclass(frozen=True)
class WorldStore:
    """Where a self-started world's store listens (loopback: every process on this machine reaches it)."""

    host: str
    port: int
    prefix: str

    @classmethod
    def of(cls, store: dist.Store, prefix: str) -> WorldStore:
        """The address of ``store`` (a ``PrefixStore`` of ``prefix`` over a ``TCPStore``)."""
        return cls(*home_of(store), prefix)


def world_started(identity: str) -> None:
    """A self-started world now runs in this process: other groups may fetch its rows over bridges."""
    with _live_lock:
        _live_worlds.add(identity)


def world_stopped(identity: str) -> None:
    """That world is shut down: its store is gone, so its rows can only be reported through the driver."""
    with _live_lock:
        _live_worlds.discard(identity)


def reachable(address: Any) -> bool:
    """Whether ``address`` (a torchrun row address) is a running self-started world's, on this machine."""
    if not (isinstance(address, tuple) and len(address) == 3 and isinstance(address[2], WorldStore)):
        return False
    with _live_lock:
        live = address[0] in _live_worlds
    return live and address[2].host == LOOPBACK


def bridge_reply_key(consumer: str) -> str:
    """Answers to the row requests of the process whose bridge id is ``consumer``, in the producing world."""
    return f"rowsbridge/{consumer}"


def _pair_prefix(producer: int, consumer: str, generation: int, cuda: bool) -> str:
    return f"rowbridge/{producer}/{consumer}/{generation}/{'nccl' if cuda else 'gloo'}/"


class RowBridges:
    """One process's bridges for lazy rows: serving its kept rows to other worlds, fetching theirs."""

    def __init__(self, rank: int) -> None:
        #: This process's data rank in its own world (names it in answers).
        self.rank = rank
        #: Fresh per process: a replaced rank's new process never meets the old one's bridges.
        self.id = uuid.uuid4().hex
        self.tags = RowTagCounter()
        self._lock = threading.Lock()
        self._reaper: SendReaper | None = None
        #: Producing side: (consumer, generation, cuda) -> bridge.
        self._serving: dict[tuple[str, int, bool], Any] = {}

    # -- producing side -------------------------------------------------------------
    def answer(self, store: dist.Store, message: tuple[Any, ...]) -> None:
        """Serve one ``("bridge", consumer, generation, fetch_id, requests, timeout)`` request."""
        _, consumer, generation, fetch_id, requests, timeout = message
        reply = bridge_reply_key(consumer)
        try:
            packed = pack([take_kept_rows(request) for request in requests])
        except Exception as exc:  # noqa: BLE001 - e.g. the rows were freed: the consumer raises it
            store.queue_push(reply, encode(("failed", fetch_id, self.rank, f"{type(exc).__name__}: {exc}")))
            return
        first = self.tags.take(packed.header.tags)
        store.queue_push(reply, encode(("rows", fetch_id, self.rank, packed.header, first, generation)))
        try:
            groups = functools.partial(self._serving_group, store, (consumer, generation), timeout=float(timeout))
            works = post_sends(packed, 1, first, self.tags, groups)
        except Exception:  # noqa: BLE001 - the consumer is gone (its own group reports that)
            with self._lock:
                for cuda in (False, True):
                    self._serving.pop((consumer, generation, cuda), None)
            return
        with self._lock:
            if self._reaper is None:
                self._reaper = SendReaper(f"dispatchcore-bridge-rows-reaper{self.rank}")
            self._reaper.add(works, packed)

    def _serving_group(self, store: dist.Store, pair: tuple[str, int], cuda: bool, timeout: float) -> Any:
        consumer, generation = pair
        name = (consumer, generation, cuda)
        group = self._serving.get(name)  # only the data thread serves: no race on building
        if group is None:
            # A connection of its own: a rendezvous that timed out leaves its connection out of step.
            own = store.clone()  # type: ignore[attr-defined]  # Store.clone is missing from torch's stubs
            prefixed = dist.PrefixStore(_pair_prefix(self.rank, consumer, generation, cuda), own)
            group = pair_group(prefixed, 0, cuda, timeout, loopback=True)
            with self._lock:
                self._serving[name] = group
        return group

    def close(self, timeout: float) -> None:
        """Let the sends posted so far finish (up to ``timeout`` s), then drop every bridge."""
        with self._lock:
            reaper = self._reaper
        if reaper is not None:
            reaper.drain(timeout)
            reaper.close()
        self._serving.clear()


class BridgeLane:
    """A consumer process's way to one other world's rows (see module doc): requests, replies, bridges."""

    def __init__(self, bridges: RowBridges, world: WorldStore, death_timeout: float) -> None:
        self._bridges = bridges
        self._world = world
        self._timeout = max(float(death_timeout), BRIDGE_FLOOR_S)
        self.key = bridge_reply_key(bridges.id)
        #: Requests go on one connection; blocking pops, the watcher and each bridge get their own.
        self.store = self.connect()
        self.replies = self.connect(forever=True)
        #: Per producing process: the generation of its bridge to this process, and the bridges built.
        self._generation: dict[int, int] = {}
        self._groups: dict[tuple[int, int, bool], Any] = {}

    def connect(self, forever: bool = False) -> dist.Store:
        """A fresh connection to the producing world's store, under its prefix (``forever``: to block on)."""
        world = self._world
        client = dist.TCPStore(
            world.host, world.port, None, False, timedelta(seconds=self._timeout), wait_for_workers=False
        )
        if forever:
            client.set_timeout(timedelta(seconds=FOREVER_S))  # pops wait for a message, never for a timeout
        return dist.PrefixStore(world.prefix, client)

    def request(self, d: int, fetch_id: int, requests: list[RowRequest], death_timeout: float) -> None:
        generation = self._generation.setdefault(d, 0)
        bound = self._timeout = max(float(death_timeout), BRIDGE_FLOOR_S)  # bridges built next get it too
        message = ("bridge", self._bridges.id, generation, fetch_id, requests, bound)
        self.store.queue_push(rows_key(d), encode(message))

    def post_recv(
        self, d: int, header: Header, first: int, generation: int
    ) -> tuple[list[torch.Tensor], list[torch.Tensor], list[Any]]:
        """Post the receives of producer ``d``'s rows over the pair's bridge (built now if new)."""
        return post_recvs(header, 0, first, self._bridges.tags, lambda cuda: self._group(d, generation, cuda))

    def _group(self, d: int, generation: int, cuda: bool) -> Any:
        name = (d, generation, cuda)
        group = self._groups.get(name)
        if group is None:
            prefixed = dist.PrefixStore(_pair_prefix(d, self._bridges.id, generation, cuda), self.connect())
            group = self._groups[name] = pair_group(prefixed, 1, cuda, self._timeout, self._world.host == LOOPBACK)
        return group

    def failed(self, d: int) -> None:
        """A transfer from ``d`` failed: its bridge is done for; a later fetch builds the next generation."""
        generation = self._generation.get(d, 0)
        for cuda in (False, True):
            self._groups.pop((d, generation, cuda), None)
        self._generation[d] = generation + 1

    def close(self) -> None:
        self._groups.clear()
        self.store = self.replies = None  # type: ignore[assignment]  # their connections go with them
