"""A data-parallel replica that all-reduces its gradient each step, shared by the failed-step tests.

Ranks in other processes cannot import ``tests/``: the module travels by
value (see ``_workers``).
"""

from __future__ import annotations

import os
import sys

import cloudpickle
import torch

from dispatchcore import Dispatch, Worker, collective, register


class Replica(Worker):
    """A data-parallel replica: each step averages a gradient over the group and applies it."""

    def __init__(self) -> None:
        self.weights = torch.zeros(4)
        self.steps = 0

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def step(self, failing_rank: int = -1) -> float:
        if self.rank == failing_rank:
            raise ValueError("a bad batch")
        grad = torch.full((4,), float(self.rank + 1))
        collective.all_reduce(grad, op="avg")
        self.weights += grad
        self.steps += 1
        return float(self.weights.sum())

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def state(self) -> tuple[int, int, float]:
        return os.getpid(), self.steps, float(self.weights.sum())


cloudpickle.register_pickle_by_value(sys.modules[__name__])
