"""The driver loop under injected faults: it recovers and ends where a fault-free run ends.

``make_group(..., faults=[...])`` (the testing kit's pytest plugin) wraps the
backend chosen for the run (``--dispatchcore-backend``, default local) in the
``faulty`` backend: nothing real crashes, so these run on a laptop in seconds.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from policy_worker import PolicyWorker
from train_loop import make_batches, train

from dispatchcore import DispatchTimeoutError, WorkerDiedError, WorkerError, WorkerGroup
from dispatchcore.testing import Fault, FaultyExecutor

RANKS = 2
BATCHES = make_batches(steps=4)


@pytest.fixture(scope="module")
def fault_free() -> Iterator[list[dict[str, Any]]]:
    """Every rank's final state after a run without faults (threads: the reference)."""
    with WorkerGroup(PolicyWorker, RANKS, backend="local") as wg:
        report, wg = train(wg, BATCHES)
        assert report.retries == report.restarts == 0
        yield wg.state()


def assert_same_states(wg: WorkerGroup[Any], expected: list[dict[str, Any]]) -> None:
    for rank, (got, want) in enumerate(zip(wg.state(), expected, strict=True)):
        assert torch.allclose(got["w"], want["w"], rtol=1e-6, atol=1e-6), f"rank {rank} ended elsewhere"


def test_a_raising_rank_is_rolled_back_and_retried(make_group: Any, fault_free: list[dict[str, Any]]) -> None:
    wg = make_group(PolicyWorker, RANKS, faults=[Fault.raise_on(rank=1, method="update", call=2)])
    report, wg = train(wg, BATCHES)
    assert (report.retries, report.restarts, len(report.losses)) == (1, 0, len(BATCHES))
    assert_same_states(wg, fault_free)  # without the rollback, rank 0 would have stepped twice


def test_a_rank_failing_every_time_is_reported(make_group: Any) -> None:
    wg = make_group(PolicyWorker, RANKS, faults=[Fault.raise_on(rank=1, method="update", call=None)])
    with pytest.raises(WorkerError) as info:
        train(wg, BATCHES, max_retries=2)
    assert (info.value.rank, info.value.method) == (1, "update")


def test_a_dead_rank_means_a_new_group_from_the_checkpoint(make_group: Any, fault_free: list[dict[str, Any]]) -> None:
    wg = make_group(PolicyWorker, RANKS, faults=[Fault.die(rank=1, method="update", call=3)])
    report, new = train(wg, BATCHES, rebuild=lambda: make_group(PolicyWorker, RANKS))
    assert report.restarts == 1 and new is not wg
    assert_same_states(new, fault_free)


@pytest.mark.timeout(120)  # the hung rank never answers: only the step timeout gets the loop past it
def test_a_hung_rank_is_cut_off_by_the_step_timeout(make_group: Any, fault_free: list[dict[str, Any]]) -> None:
    wg = make_group(PolicyWorker, RANKS, faults=[Fault.hang(rank=0, method="update", call=2)])
    report, new = train(wg, BATCHES, step_timeout=2.0, rebuild=lambda: make_group(PolicyWorker, RANKS))
    assert report.restarts == 1
    assert_same_states(new, fault_free)


def test_a_slow_rank_is_only_slow(make_group: Any, fault_free: list[dict[str, Any]]) -> None:
    wg = make_group(PolicyWorker, RANKS, faults=[Fault.slow(rank=1, method="update", seconds=0.2, call=None)])
    report, wg = train(wg, BATCHES, step_timeout=60.0)
    assert (report.retries, report.restarts) == (0, 0)
    assert len(FaultyExecutor.of(wg).fired) == len(BATCHES)
    assert_same_states(wg, fault_free)


def test_the_loop_gives_up_after_max_restarts(make_group: Any) -> None:
    def dying_group() -> WorkerGroup[Any]:
        return make_group(PolicyWorker, RANKS, faults=[Fault.die(rank=0, method="update", call=1)])

    with pytest.raises(WorkerDiedError) as info:
        train(dying_group(), BATCHES, rebuild=dying_group, max_restarts=1)
    assert info.value.rank == 0 and info.value.method == "update"


def test_without_a_rebuild_the_loop_reports_the_timeout(make_group: Any) -> None:
    wg = make_group(PolicyWorker, RANKS, faults=[Fault.slow(rank=1, method="update", seconds=600)])
    with pytest.raises(DispatchTimeoutError, match=r"rank\(s\) \[1\]"):
        train(wg, BATCHES, step_timeout=0.5)
