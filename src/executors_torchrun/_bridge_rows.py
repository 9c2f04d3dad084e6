"""Lazy rows between processes of two self-started worlds, over bridges (docs/lazy-results.md).

A consuming rank cannot use its own world's transport to reach another
world, but it reaches that world's store (a driver-hosted ``TCPStore`` on
loopback): the rows move over a two-rank gloo (NCCL for CUDA) group that
meets on a ``PrefixStore`` of it, unique to the pair, as weights do
(``_bridge``).  Requests and reply headers are the in-world fetch's
messages on the driver's links (``_post``), so one loop (``_row_plane``)
serves both.  A pair's bridge is
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

from dispatchcore.executor import LOOPBACK, SendReaper, pair_group, take_kept_rows

from ._hub import running
from ._post import Address, Post
from ._protocol import home_of
from ._transport import RowTagCounter, post_recvs, post_sends
from ._wire import Header, pack

#: Bridges are never given less than this bound (a busy machine must not look like a dead producer).
BRIDGE_FLOOR_S = 3.0


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


def reachable(address: Any) -> bool:
    """Whether ``address`` (a torchrun row address) is a running self-started world's, on this machine."""
    if not (isinstance(address, tuple) and len(address) == 3 and isinstance(address[2], WorldStore)):
        return False
    return running(address[0]) and address[2].host == LOOPBACK


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
    def answer(self, post: Post, store: dist.Store, consumer: Address, message: tuple[Any, ...]) -> None:
        """Serve one ``("fetch", fetch_id, requests, (bridge id, generation, timeout))`` from another world."""
        _, fetch_id, requests, (bridge, generation, timeout) = message
        try:
            packed = pack([take_kept_rows(request) for request in requests])
        except Exception as exc:  # noqa: BLE001 - e.g. the rows were freed: the consumer raises it
            post.send(consumer, ("failed", fetch_id, f"{type(exc).__name__}: {exc}"))
            return
        first = self.tags.take(packed.header.tags)
        post.send(consumer, ("rows", fetch_id, packed.header, first, generation))
        try:
            groups = functools.partial(self._serving_group, store, (bridge, generation), timeout=float(timeout))
            works = post_sends(packed, 1, first, self.tags, groups)
        except Exception:  # noqa: BLE001 - the consumer is gone (its own group reports that)
            with self._lock:
                for cuda in (False, True):
                    self._serving.pop((bridge, generation, cuda), None)
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
    """A consumer process's bridges to one other world's rows (see module doc)."""

    def __init__(self, bridges: RowBridges, world: WorldStore, death_timeout: float) -> None:
        self._bridges = bridges
        self._world = world
        self._timeout = max(float(death_timeout), BRIDGE_FLOOR_S)
        #: Per producing process: the generation of its bridge to this process, and the bridges built.
        self._generation: dict[int, int] = {}
        self._groups: dict[tuple[int, int, bool], Any] = {}

    def ask(self, d: int, death_timeout: float) -> tuple[str, int, float]:
        """What a request to producer ``d`` carries: this process's bridge id, the pair's generation, the bound."""
        bound = self._timeout = max(float(death_timeout), BRIDGE_FLOOR_S)  # bridges built next get it too
        return self._bridges.id, self._generation.setdefault(d, 0), bound

    def post_recv(
        self, d: int, header: Header, first: int, generation: int
    ) -> tuple[list[torch.Tensor], list[torch.Tensor], list[Any]]:
        """Post the receives of producer ``d``'s rows over the pair's bridge (built now if new)."""
        return post_recvs(header, 0, first, self._bridges.tags, lambda cuda: self._group(d, generation, cuda))

    def _group(self, d: int, generation: int, cuda: bool) -> Any:
        name = (d, generation, cuda)
        group = self._groups.get(name)
        if group is None:
            world = self._world
            client = dist.TCPStore(
                world.host, world.port, None, False, timedelta(seconds=self._timeout), wait_for_workers=False
            )
            home = dist.PrefixStore(world.prefix, client)
            prefixed = dist.PrefixStore(_pair_prefix(d, self._bridges.id, generation, cuda), home)
            group = self._groups[name] = pair_group(prefixed, 1, cuda, self._timeout, world.host == LOOPBACK)
        return group

    def failed(self, d: int) -> None:
        """A transfer from ``d`` failed: its bridge is done for; a later fetch builds the next generation."""
        generation = self._generation.get(d, 0)
        for cuda in (False, True):
            self._groups.pop((d, generation, cuda), None)
        self._generation[d] = generation + 1

    def close(self) -> None:
        self._groups.clear()
