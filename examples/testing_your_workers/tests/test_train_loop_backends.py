"""The same driver loop on the backend chosen for the run.

``python -m pytest examples/testing_your_workers`` runs it on threads;
``--dispatchcore-backend=ray`` (or ``torchrun``, ``multiprocess``) reruns
this file, and the fault tests, on that backend, unchanged.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from balanced_mode import deal, row_tokens
from policy_worker import PolicyWorker
from train_loop import make_batches, train

from dispatchcore import WorkerGroup


def test_loop_trains_the_same_on_the_chosen_backend(make_group: Any, dispatchcore_backend: str) -> None:
    batches = make_batches(steps=6)
    wg = make_group(PolicyWorker, 2)
    assert wg.backend == dispatchcore_backend
    report, wg = train(wg, batches)
    assert report.losses[-1] < report.losses[0], "the toy policy should learn"
    with WorkerGroup(PolicyWorker, 2, backend="local") as reference:
        expected, reference = train(reference, batches)
        for got, want in zip(wg.state(), reference.state(), strict=True):
            assert torch.allclose(got["w"], want["w"], rtol=1e-6, atol=1e-6)
    assert report.losses == pytest.approx(expected.losses, rel=1e-5)


def test_balanced_rows_come_back_in_order_on_the_chosen_backend(make_group: Any) -> None:
    batch = make_batches(steps=1, rows=11)[0]
    wg = make_group(PolicyWorker, 3)
    wg.init_model(0.0)
    out = wg.update(batch)
    assert len(out) == len(batch)
    # BALANCED gives the longest rollouts to different ranks: rank of row i follows the deal.
    owner = torch.empty(len(batch), dtype=torch.long)
    for rank, rows in enumerate(deal(row_tokens(batch), 3)):
        owner[torch.as_tensor(rows)] = rank
    assert torch.equal(out.batch["rank"], owner)
