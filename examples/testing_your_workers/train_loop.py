"""A user's driver loop, with the error handling the tests hold it to.

* A rank raises (``WorkerError``): the other ranks may have stepped already,
  so every rank rolls back to the state before the step, then the step is
  retried (``max_retries`` times per step).
* A rank dies or hangs past ``step_timeout`` (``WorkerDiedError``,
  ``DispatchTimeoutError``): the group is gone.  A new one comes from
  ``rebuild()``, gets the last checkpoint, and the loop goes on
  (``max_restarts`` in all).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from dispatchcore import DataProto, DispatchTimeoutError, WorkerDiedError, WorkerError, WorkerGroup


@dataclass
class TrainReport:
    """What happened: mean loss per step, steps retried, groups rebuilt."""

    losses: list[float] = field(default_factory=list)
    retries: int = 0
    restarts: int = 0


def make_batches(steps: int, rows: int = 13, dim: int = 4, seed: int = 0) -> list[DataProto]:
    """Odd-sized batches of rollouts of 1..8 tokens whose reward is linear in the features."""
    gen = torch.Generator().manual_seed(seed)
    true_w = torch.arange(1.0, dim + 1)
    batches = []
    for _ in range(steps):
        x = torch.randn(rows, dim, generator=gen)
        lengths = torch.randint(1, 9, (rows, 1), generator=gen)
        mask = (torch.arange(8) < lengths).long()
        batches.append(
            DataProto.from_dict({"features": x, "reward": x @ true_w, "attention_mask": mask}, auto_padding=True)
        )
    return batches


def train(
    wg: WorkerGroup[Any],
    batches: Sequence[DataProto],
    *,
    lr: float = 0.1,
    step_timeout: float | None = None,
    rebuild: Callable[[], WorkerGroup[Any]] | None = None,
    max_retries: int = 1,
    max_restarts: int = 1,
) -> tuple[TrainReport, WorkerGroup[Any]]:
    """One update per batch; returns the report and the group in use at the end."""
    report = TrainReport()
    wg.init_model(lr)
    checkpoint = wg.state()
    step, retries_here = 0, 0
    while step < len(batches):
        try:
            out = wg.update.options(timeout=step_timeout)(batches[step])
        except WorkerError:
            if retries_here >= max_retries:
                raise
            retries_here += 1
            report.retries += 1
            wg.load_state(checkpoint)
            continue
        except (WorkerDiedError, DispatchTimeoutError):
            if rebuild is None or report.restarts >= max_restarts:
                raise
            report.restarts += 1
            wg.shutdown()
            wg = rebuild()
            wg.init_model(lr)
            wg.load_state(checkpoint)
            continue
        report.losses.append(float(out.batch["loss"].mean()))
        checkpoint = wg.state()
        step, retries_here = step + 1, 0
    return report, wg
