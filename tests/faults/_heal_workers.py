"""Workers for the state hand-over tests (importable by Ray and torchrun ranks): training moves weights off setup's."""

from __future__ import annotations

import os
import time
from typing import Any

import torch

from dispatchcore import Dispatch, RowShard, Worker, register


class Trainer(Worker):
    """Setup makes the same weights on every rank; each ``train`` step moves them (optimizer moments too)."""

    @register(Dispatch.ONE_TO_ALL, setup=True)
    def init_model(self, seed: int) -> None:
        self.weight = torch.randn(64, 32, generator=torch.Generator().manual_seed(seed))
        self.moment = torch.zeros(64, 32)
        self.steps = torch.zeros((), dtype=torch.int64)

    @register(Dispatch.ONE_TO_ALL)
    def train(self, steps: int) -> None:
        for _ in range(steps):
            self.moment.mul_(0.9).add_(self.weight, alpha=0.1)
            self.weight.sub_(self.moment, alpha=0.01)
            self.steps += 1

    @register(Dispatch.ONE_TO_ALL, retry=True)
    def checksum(self) -> tuple[float, int, int, Any]:
        """What must match on replicas, this process, and the version a weight sync set."""
        total = float(self.weight.double().sum() + self.moment.double().sum())
        return total, int(self.steps), os.getpid(), getattr(self, "weights_version", None)

    @register(Dispatch.ONE_TO_ALL)
    def checksum_once(self) -> float:
        """Not retry-safe: after an automatic replacement the death is raised, with its notes."""
        return float(self.weight.double().sum())

    @register(Dispatch.ONE_TO_ALL)
    def fail_while_one_hangs(self, stuck: int) -> None:
        """Rank 0 raises; rank ``stuck`` takes one more step, then stays in the call, deaf to interrupts."""
        if self.rank == 0:
            raise RuntimeError("the step failed")
        if self.rank == stuck:
            self.train(1)
            deadline = time.monotonic() + 60.0
            while time.monotonic() < deadline:
                try:
                    time.sleep(0.05)
                except BaseException:  # noqa: BLE001, S110 - stuck: the cancel's interrupt does not end it
                    pass

    @register(Dispatch.ONE_TO_ALL)
    def set_version(self, version: int) -> None:
        """As a ``WeightSync`` into this group would."""
        self.weights_version = version


class Healing(Trainer):
    """Hands its state over: a replaced rank takes a live replica's."""

    def replica_state(self) -> dict[str, torch.Tensor]:
        return {"weight": self.weight, "moment": self.moment, "steps": self.steps}

    def load_replica_state(self, state: dict[str, torch.Tensor]) -> None:
        self.weight.copy_(state["weight"])
        self.moment.copy_(state["moment"])
        self.steps.copy_(state["steps"])


class TensorParallel(Healing):
    """Pairs of ranks hold two halves of one model (dp group = rank // 2): rank r's replica is r ± 2."""

    replicas = "tp"

    @register(Dispatch.ONE_TO_ALL, setup=True)
    def init_model(self, seed: int) -> None:
        super().init_model(seed + self.rank % 2)  # the two halves differ
        self._register_dispatch_collect_info("tp", dp_rank=self.rank // 2, is_collect=self.rank % 2 == 0)


class UnmarkedShards(Healing):
    """Offers only its half of the rows, as FSDP2 would, without saying ``replicas = None``."""

    def replica_state(self) -> dict[str, Any]:
        half = self.rank % 2 * 32
        return {"weight": RowShard(self.weight[half : half + 32], half, (64, 32))}
