"""``grow(k, sync=...)`` never mixes versions (issue 40, item 2).

The old ranks hold version 1; the trainer steps; then:
- ``grow(2, sync=sync, version=1)``: the new ranks get version 1's bytes (from an old rank), not the
  trainer's current ones, and every rank says version 1;
- ``grow(2, sync=sync, version=2)``: every rank is synced from the trainer and says version 2;
- ``version=None``: the version the old ranks hold; a sync that failed half-way: every rank is synced.
``verify()`` passes whenever the trainer has not moved since the ranks' version.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from dispatchcore import Dispatch, DispatchError, WeightSync, Worker, WorkerGroup, register


class Trainer(Worker):
    def __init__(self) -> None:
        self.w = torch.zeros(4)

    @register(Dispatch.ONE_TO_ALL)
    def step(self, value: float) -> None:
        self.w = torch.full((4,), value)

    def weights(self) -> dict[str, torch.Tensor]:
        return {"w": self.w}


class Rollout(Worker):
    fail_apply_on: int | None = None

    def __init__(self) -> None:
        self.w = torch.full((4,), -1.0)

    def load_weights(self, named: list[tuple[str, torch.Tensor]]) -> None:
        if self.rank == type(self).fail_apply_on:
            raise RuntimeError("apply failed on purpose")
        for _, t in named:
            self.w = t.clone()

    def weights(self) -> dict[str, torch.Tensor]:
        return {"w": self.w}

    @register(Dispatch.ONE_TO_ALL)
    def held(self) -> tuple[float, Any]:
        return float(self.w[0]), getattr(self, "weights_version", None)


class Blind(Rollout):
    """Cannot say what it holds: no ``weights`` method to copy from."""

    weights = None  # type: ignore[assignment]


@pytest.fixture
def groups():
    with WorkerGroup(Trainer, 1, backend="local") as trainer, WorkerGroup(Rollout, 2, backend="local") as rollout:
        yield trainer, rollout


def test_the_same_version_gives_the_new_ranks_the_old_ranks_bytes(groups) -> None:
    trainer, rollout = groups
    sync = WeightSync(trainer, rollout)
    trainer.step(1.0)
    sync(1)
    trainer.step(2.0)  # the trainer moved on; version 1 is still what the rollouts hold
    rollout.grow(2, sync=sync, version=1)
    assert rollout.held() == [(1.0, 1)] * 4
    sync(2)
    assert rollout.held() == [(2.0, 2)] * 4
    sync.verify()


def test_a_new_version_syncs_every_rank(groups) -> None:
    trainer, rollout = groups
    sync = WeightSync(trainer, rollout)
    trainer.step(1.0)
    sync(1)
    trainer.step(2.0)
    rollout.grow(2, sync=sync, version=2)
    assert rollout.held() == [(2.0, 2)] * 4
    sync.verify()


def test_version_none_means_the_version_the_old_ranks_hold(groups) -> None:
    trainer, rollout = groups
    sync = WeightSync(trainer, rollout)
    trainer.step(1.0)
    sync(1)
    rollout.grow(1, sync=sync)
    assert rollout.held() == [(1.0, 1)] * 3
    sync.verify()


def test_before_any_sync_every_rank_is_synced(groups) -> None:
    trainer, rollout = groups
    sync = WeightSync(trainer, rollout)
    trainer.step(3.0)
    rollout.grow(1, sync=sync, version=7)
    assert rollout.held() == [(3.0, 7)] * 3


def test_after_a_failed_sync_every_rank_is_synced(groups) -> None:
    trainer, rollout = groups
    sync = WeightSync(trainer, rollout)
    trainer.step(1.0)
    sync(1)
    trainer.step(2.0)
    Rollout.fail_apply_on = 1
    try:
        with pytest.raises(Exception, match="apply failed on purpose"):
            sync(2)  # rank 0 may hold 2.0, rank 1 holds 1.0: the ranks disagree
    finally:
        Rollout.fail_apply_on = None
    assert not sync.holds(1) and not sync.holds(2)
    rollout.grow(1, sync=sync, version=1)  # not a copy of a rank that may differ: all from the source
    assert rollout.held() == [(2.0, 1)] * 3
    sync.verify()


def test_a_destination_that_cannot_say_what_it_holds_is_refused_before_growing() -> None:
    with WorkerGroup(Trainer, 1, backend="local") as trainer, WorkerGroup(Blind, 2, backend="local") as rollout:
        sync = WeightSync(trainer, rollout)
        sync(1)
        with pytest.raises(DispatchError, match=r"no 'weights' method .*grow with a new version"):
            rollout.grow(1, sync=sync, version=1)
        assert rollout.world_size == 2
        rollout.grow(1, sync=sync, version=2)
        assert rollout.held() == [(0.0, 2)] * 3


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_self_started_torchrun_copies_the_old_version_rank_to_rank() -> None:
    """The copy goes between ranks of one process group (Ray's was checked by hand: the same core path)."""
    with (
        WorkerGroup(Trainer, 1, backend="torchrun") as trainer,
        WorkerGroup(Rollout, 2, backend="torchrun", spare_ranks=1) as rollout,
    ):
        sync = WeightSync(trainer, rollout)
        trainer.step(1.0)
        sync(1)
        trainer.step(2.0)
        rollout.grow(1, sync=sync, version=1)
        assert rollout.held() == [(1.0, 1)] * 3
        sync(2)
        sync.verify()
