"""The demo with a separate rollout group (``--rollout-ranks K``), its weights synced from the actor every step.

As many rollout ranks as actor ranks draw the same samples with the same
weights, so the learning curve is the actor-generates one exactly; another
count samples differently but must learn as well, on local and on a process
backend (whose curve, for one seed, is local's).
"""

from __future__ import annotations

import math

import pytest

from dispatchcore import WeightSync, WorkerGroup, available_backends
from dispatchcore.demo import DemoConfig, StepMetrics, run_demo
from dispatchcore.demo.cli import add_arguments
from dispatchcore.demo.loop import main
from dispatchcore.demo.workers import ActorWorker, ModelConfig, RolloutWorker

STEPS = 3


def numbers(history: list[StepMetrics]) -> list[tuple[float, float, float]]:
    return [(m.reward, m.loss, m.kl) for m in history]


def rises(history: list[StepMetrics]) -> tuple[float, float]:
    """(first, last) mean reward over three steps, as ``test_reward_rises_on_local`` judges it."""
    first = sum(m.reward for m in history[:3]) / 3
    last = sum(m.reward for m in history[-3:]) / 3
    return first, last


def test_as_many_rollout_ranks_as_actor_ranks_give_the_same_curve() -> None:
    """Same per-rank seeds, same split, weights copied exactly: the numbers are bit-identical."""
    today = run_demo(DemoConfig(backend="local", world_size=2, steps=STEPS))
    split = run_demo(DemoConfig(backend="local", world_size=2, steps=STEPS, rollout_ranks=2))
    assert numbers(split) == numbers(today)


def test_lazy_rollout_group_gives_the_same_curve() -> None:
    """Lazy results of the rollout group, consumed by the reward and actor groups: the same numbers."""
    today = run_demo(DemoConfig(backend="local", world_size=2, steps=2))
    lazy = run_demo(DemoConfig(backend="local", world_size=2, steps=2, rollout_ranks=2, lazy=True))
    assert numbers(lazy) == numbers(today)


def test_one_rollout_rank_for_two_actor_ranks_learns_on_local() -> None:
    history = run_demo(DemoConfig(backend="local", world_size=2, steps=25, rollout_ranks=1))
    first, last = rises(history)
    assert first < 0.3 and last > first + 0.3, (first, last)


def test_rollout_weights_follow_the_actor() -> None:
    """After a sync every rollout rank holds the actor's weights and the version passed; before, its own."""
    with (
        WorkerGroup(ActorWorker, 2, backend="local") as actor,
        WorkerGroup(RolloutWorker, 3, backend="local") as rollout,
    ):
        actor.init_model(ModelConfig(seed=0))
        rollout.init_model(ModelConfig(seed=1))  # other initial weights: the sync must replace them
        want = actor.weights_digest()[0]
        before = rollout.weights_digest()
        assert all(digest != want and version is None for digest, version in before)
        report = WeightSync(actor, rollout)(version=7)
        assert report.driver_bytes == 0
        assert rollout.weights_digest() == [(want, 7)] * 3


@pytest.mark.timeout(240)
def test_one_rollout_rank_on_torchrun_matches_local() -> None:
    """A process backend: rank-to-rank sync, the same curve as local's for one rollout rank (which learns)."""
    if "torchrun" not in available_backends():
        pytest.skip("torchrun backend not available")
    local = numbers(run_demo(DemoConfig(backend="local", world_size=2, steps=STEPS, rollout_ranks=1)))
    got = numbers(run_demo(DemoConfig(backend="torchrun", world_size=2, steps=STEPS, rollout_ranks=1)))
    assert len(got) == len(local)
    for row_got, row_local in zip(got, local, strict=True):
        for x, y in zip(row_got, row_local, strict=True):
            assert math.isclose(x, y, rel_tol=1e-4, abs_tol=1e-5), (got, local)
    assert got[-1][0] > got[0][0], "reward goes up"


def test_cli_option(capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert parser.parse_args([]).rollout_ranks is None
    assert parser.parse_args(["--rollout-ranks", "3"]).rollout_ranks == 3
    assert main(["--steps", "1", "--rollout-ranks", "1"]) == 0
    assert "rollout=1" in capsys.readouterr().out
