"""The executor's own process groups, built directly on a prefixed store (never the user's default group).

Only point-to-point ops are used, each received after the store message
saying it was posted, so no rank ever sits in a gloo op while idle (a gloo
op that waits past its timeout kills the group).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from dispatchcore import DispatchError
from dispatchcore.executor import gloo_group, nccl_group

from ._wire import Header, Packed, empty_buffers, empty_device_tensors

#: Row payloads (lazy results moved rank to rank) use tags from here up.
ROW_TAG_BASE = 1 << 30
_ROW_TAG_SPACE = (1 << 31) - 1 - ROW_TAG_BASE
#: Picks the group for a payload's CPU (``False``) or CUDA (``True``) tensors.
Groups = Callable[[bool], Any]


class RowTagCounter:
    """Tags for the rows one process sends: unique per message, so concurrent fetches never match wrongly."""

    def __init__(self) -> None:
        self._next = itertools.count()
        self._lock = threading.Lock()

    def take(self, count: int) -> int:
        """The first of ``count`` consecutive message numbers reserved for one value."""
        with self._lock:
            first = next(self._next)
            for _ in range(count - 1):
                next(self._next)
        return first

    def tag(self, number: int) -> int:
        return ROW_TAG_BASE + number % _ROW_TAG_SPACE


def post_sends(packed: Packed, peer: int, first: int, tags: RowTagCounter, groups: Groups) -> list[Any]:
    """Post the sends of ``packed``'s payload; the caller keeps ``packed`` alive until they complete."""
    works = []
    number = first
    for buf in packed.buffers:
        if buf.numel():
            works.append(groups(False).send([buf], peer, tags.tag(number)))
            number += 1
    works.extend(groups(True).send([t.contiguous()], peer, 0) for t in packed.device_tensors)
    return works


def post_recvs(
    header: Header, peer: int, first: int, tags: RowTagCounter, groups: Groups
) -> tuple[list[torch.Tensor], list[torch.Tensor], list[Any]]:
    """Post the receives of a value's payload; the buffers are filled once every work is waited on."""
    buffers = empty_buffers(header)
    device = empty_device_tensors(header)
    works = []
    number = first
    for buf in buffers:
        if buf.numel():
            works.append(groups(False).recv([buf], peer, tags.tag(number)))
            number += 1
    works.extend(groups(True).recv([t], peer, 0) for t in device)
    return buffers, device, works


class Transport:
    """This process's groups for rows moving between the processes of its world.

    A generation is one gloo group over the world's live processes (``members``, data ranks in order); a
    self-started world that adds processes builds the next one on a fresh store prefix (``rebuild``) and
    keeps the earlier ones, so rows posted on one just before are still received on it.
    """

    def __init__(
        self,
        store: dist.Store,
        rank: int,
        members: Sequence[int],
        timeout: timedelta,
        *,
        loopback: bool = False,
        generation: int = 0,
    ) -> None:
        self.rank = rank
        self._store = store
        self._timeout = timeout
        #: Whether its gloo groups (and the process's bridges) listen on loopback only.
        self.loopback = loopback
        self._generations: dict[int, tuple[dict[int, int], Any]] = {}
        self._cond = threading.Condition()
        self.generation = -1
        self._rows_nccl: dict[tuple[int, str], Any] = {}
        self._nccl_lock = threading.Lock()
        self.rebuild(generation, members)

    @property
    def size(self) -> int:
        """Processes in the newest generation."""
        with self._cond:
            return len(self._generations[self.generation][0])

    def rebuild(self, generation: int, members: Sequence[int]) -> None:
        """Join generation ``generation``'s gloo group over ``members`` (every one of them joins it at once)."""
        ranks = {d: i for i, d in enumerate(members)}
        # A connection of its own: a client runs one request at a time, and a rebuild that waits for a member
        # which died mid-grow must not hold up the next one (or anything else on the store).
        clone = getattr(self._store, "clone", None)  # TCPStore and PrefixStore have it (not in torch's stubs)
        base = clone() if isinstance(self._store, (dist.TCPStore, dist.PrefixStore)) and clone else self._store
        store = dist.PrefixStore(f"gloo/{generation}/", base)
        gloo = gloo_group(store, ranks[self.rank], len(members), self._timeout, self.loopback)
        with self._cond:
            self._generations[generation] = (ranks, gloo)
            self.generation = max(self.generation, generation)
            self._cond.notify_all()

    def link(self, sender: int, receiver: int, generation: int | None = None) -> tuple[int, int, Groups]:
        """Rows ``sender`` -> ``receiver`` (data ranks) on ``generation`` (default: the newest).

        Returns the generation, the other process's rank in its group, and the groups: gloo for CPU tensors,
        that direction's NCCL group for CUDA (NCCL matches a pair's ops in issue order: rows going both ways on
        one communicator would deadlock).
        """
        with self._cond:
            if generation is not None and generation not in self._generations:  # its rebuild is finishing here
                self._cond.wait_for(lambda: generation in self._generations, self._timeout.total_seconds())
            g = self.generation if generation is None else generation
            if g not in self._generations:
                raise DispatchError(f"this process never joined generation {g} of its world's row transport")
            ranks, gloo = self._generations[g]
        other = receiver if sender == self.rank else sender
        if other not in ranks:
            raise DispatchError(f"process {other} is not in generation {g} of this world's row transport")
        lane = "up" if sender < receiver else "down"
        return g, ranks[other], lambda cuda: self._rows_device_group(g, lane) if cuda else gloo

    def _rows_device_group(self, generation: int, lane: str) -> Any:
        with self._nccl_lock:
            group = self._rows_nccl.get((generation, lane))
            if group is None:
                with self._cond:
                    ranks = self._generations[generation][0]
                store = dist.PrefixStore(f"nccl-rows/{generation}/{lane}/", self._store)
                group = nccl_group(store, ranks[self.rank], len(ranks), self._timeout)
                self._rows_nccl[(generation, lane)] = group
            return group

    def close(self) -> None:
        """Drop the groups this transport built, and its store (released, not shut: shutdown() then exit aborted)."""
        self._rows_nccl = {}
        with self._cond:
            self._generations = {}
        self._store = None  # type: ignore[assignment]
