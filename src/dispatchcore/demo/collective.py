"""Gradient all-reduce for data-parallel training, on any backend.

Process backends (ray, torchrun) run one worker per process, so the workers
join a gloo process group of their own (``init_process_group`` reads the
``RANK``/``MASTER_*`` environment the executor set).  The local backend's
ranks are threads of one process, where torch.distributed cannot have
several ranks; they meet at a barrier and sum in rank order instead.  Both
give the same sums (exactly for two ranks, within float rounding beyond).
"""

from __future__ import annotations

import threading
from typing import Any, ClassVar

import torch
import torch.distributed as dist


class ThreadAllReduce:
    """All-reduce (sum) between the rank threads of one local group."""

    _by_key: ClassVar[dict[str, ThreadAllReduce]] = {}
    _lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self.barrier = threading.Barrier(world_size)
        self.slots: list[torch.Tensor | None] = [None] * world_size

    @classmethod
    def for_group(cls, key: str, world_size: int) -> ThreadAllReduce:
        with cls._lock:
            found = cls._by_key.get(key)
            if found is None:
                found = cls._by_key[key] = cls(world_size)
            return found

    def all_reduce(self, rank: int, flat: torch.Tensor, timeout: float = 120.0) -> None:
        """Replace ``flat`` by the sum of every rank's ``flat`` (summed in rank order)."""
        self.slots[rank] = flat.clone()
        self.barrier.wait(timeout)
        total = self.slots[0].clone()  # type: ignore[union-attr]
        for other in self.slots[1:]:
            total += other  # type: ignore[operator]
        self.barrier.wait(timeout)  # nobody overwrites a slot before all have read
        flat.copy_(total)


class GradientReducer:
    """Sums a model's gradients over the data-parallel ranks."""

    def __init__(self, mode: str, rank: int, world_size: int, key: str) -> None:
        self.mode, self.rank, self.world_size = mode, rank, world_size
        self.thread_group = ThreadAllReduce.for_group(key, world_size) if mode == "thread" else None
        if mode == "gloo" and world_size > 1 and not dist.is_initialized():
            dist.init_process_group("gloo")

    def all_reduce(self, flat: torch.Tensor) -> None:
        if self.world_size == 1:
            return
        if self.thread_group is not None:
            self.thread_group.all_reduce(self.rank, flat)
        else:
            dist.all_reduce(flat, op=dist.ReduceOp.SUM)

    def rebuild(self) -> None:
        """After ranks were replaced: leave the old world and join the new one (rendezvous env updated)."""
        if self.mode != "gloo" or self.world_size == 1:
            return
        if dist.is_initialized():
            dist.destroy_process_group()
        dist.init_process_group("gloo")

    def broadcast_objects(self, objects: list[Any], src: int) -> None:
        """Replace ``objects`` on every rank by ``src``'s (picklable objects; process backends only)."""
        if self.world_size == 1 or self.thread_group is not None:
            return
        dist.broadcast_object_list(objects, src=src)

    def close(self) -> None:
        if self.mode == "gloo" and dist.is_initialized():
            dist.destroy_process_group()
