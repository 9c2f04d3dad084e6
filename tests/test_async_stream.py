"""Async RL on real backends: a rollout group streams versioned lazy batches into a trainer under a staleness bound.

The property (Hypothesis, sleep-based generation times with a long tail):
every consumed row is at most ``k`` versions older than the trainer that
trains on it (read on the trainer rank from the rows themselves, which came
rank to rank), no prompt batch is consumed twice or lost, each rank's
versions never go back, and the weights a row was made with are the ones its
stamp names.  Faults: a raise loses only that batch, which is regenerated.
Shutdown: nothing is left generating, and the ranks keep no rows.
"""

from __future__ import annotations

import collections
import gc
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dispatchcore
from dispatchcore import (
    DataProto,
    Dispatch,
    MaxStaleness,
    RolloutStream,
    Worker,
    WorkerError,
    WorkerGroup,
    available_backends,
    register,
    versioned,
    weights_version_of,
)
from dispatchcore.executor import kept_results

pytestmark = pytest.mark.timeout(180)


class Trainer(Worker):
    def __init__(self) -> None:
        self.w = torch.zeros(2)
        self.version = 0

    @register(Dispatch.ONE_TO_ALL)
    def reset(self) -> None:
        self.w.zero_()
        self.version = 0

    def weights(self) -> dict[str, torch.Tensor]:
        return {"w": self.w}

    @register(Dispatch.DP_COMPUTE_PROTO)
    def train(self, data: DataProto) -> DataProto:
        """One step: each row's staleness against this trainer's version, read from the rows that arrived."""
        staleness = self.version - data.batch["version"]
        out = {k: data.batch[k].clone() for k in ("pid", "version", "wv", "rank")}
        self.version += 1
        self.w += 1.0
        return DataProto.from_dict({**out, "staleness": staleness})


class Rollout(Worker):
    def __init__(self) -> None:
        self.w = torch.zeros(2)
        self.fail_dir: str | None = None
        self.die = False

    @register(Dispatch.ONE_TO_ALL)
    def reset(self, fail_dir: str | None = None, die: bool = False) -> None:
        self.w.zero_()
        self.__dict__.pop("weights_version", None)
        self.fail_dir, self.die = fail_dir, die

    def load_weights(self, weights: list[tuple[str, torch.Tensor]]) -> None:
        for _, t in weights:
            self.w.copy_(t)

    @register(Dispatch.ONE_TO_ALL)
    def kept(self) -> int:
        return kept_results()

    @register(Dispatch.DP_COMPUTE_PROTO)
    @versioned
    def generate(self, prompts: DataProto) -> DataProto:
        pid = int(prompts.batch["pid"][0])
        if self.fail_dir is not None and pid % 4 == 1:
            marker = Path(self.fail_dir) / f"{pid}"
            if not marker.exists():  # the first try of this batch raises, on whichever rank runs it
                marker.touch()
                if self.die:
                    os._exit(3)
                raise RuntimeError(f"generation of prompt batch {pid} broke")
        end = time.monotonic() + float(prompts.batch["sleep"][0])
        while time.monotonic() < end:  # in short naps: a cancel lands between two (a local rank is a thread)
            time.sleep(min(0.01, max(0.0, end - time.monotonic())))
        n = len(prompts)
        version = weights_version_of(self) or 0
        return DataProto.from_dict(
            {
                "pid": prompts.batch["pid"].clone(),
                "version": torch.full((n,), version),
                "wv": torch.full((n,), float(self.w[0])),
                "rank": torch.full((n,), self.rank),
            }
        )


BACKENDS = ["local", "torchrun"]


@pytest.fixture(scope="module", params=BACKENDS)
def started(request: pytest.FixtureRequest) -> Iterator[list[WorkerGroup]]:
    """One trainer and one rollout group per backend for the module, started again if a test broke them."""
    if request.param not in available_backends():
        pytest.skip(f"{request.param} backend unavailable")
    held: list[WorkerGroup] = [request.param]  # type: ignore[list-item]
    yield held
    for wg in held[1:]:
        wg.shutdown()


@pytest.fixture
def groups(started: list[Any]) -> tuple[WorkerGroup, WorkerGroup]:
    backend = started[0]
    if len(started) == 1 or started[2].executor.broken:
        for wg in started[1:]:
            wg.shutdown()
        started[1:] = [WorkerGroup(Trainer, 1, backend=backend), WorkerGroup(Rollout, 2, backend=backend)]
    return started[1], started[2]


def _prompts(sleeps: list[float], rows: int = 2) -> list[DataProto]:
    return [
        DataProto.from_dict({"pid": torch.full((rows,), i), "sleep": torch.full((rows,), s)})
        for i, s in enumerate(sleeps)
    ]


def _run(trainer: WorkerGroup, rollout: WorkerGroup, stream: RolloutStream) -> tuple[list[DataProto], list[Any]]:
    outs, steps = [], []
    for step in stream:
        outs.append(trainer.train(step.data))
        steps.append(step)
        stream.publish(stream.trainer_version + 1)
    stream.close()
    return outs, steps


def _check(outs: list[DataProto], steps: list[Any], stream: RolloutStream, k: int, n: int) -> None:
    rows = DataProto.concat(outs)
    assert int(rows.batch["staleness"].max()) <= k  # on the trainer rank, from the rows themselves
    assert int(rows.batch["staleness"].min()) >= 0
    assert all(s <= k for step in steps for s in step.staleness)
    # The weights the stamp names, or the next step's: with weights_from=trainer (no snapshot=) a rank's sync
    # reads the trainer after the step it queued behind (docs/async-rl.md), so the stamp is a lower bound.
    stamped = rows.batch["version"].float()
    assert bool(((rows.batch["wv"] >= stamped) & (rows.batch["wv"] <= stamped + 1)).all()), (rows.batch["wv"], stamped)
    pids = collections.Counter(int(p) for p in rows.batch["pid"][::2])
    given_up = sum(1 for e in stream.evicted if not e.regenerated)  # too slow for k, max_attempts times
    assert set(pids) <= set(range(n)) and max(pids.values()) == 1  # none consumed twice
    assert len(pids) + given_up == n  # none lost: each consumed once, or given up and reported
    seqs = [b.seq for b in stream.consumed]
    assert len(seqs) == len(set(seqs))
    per_rank: dict[int, list[tuple[float, int]]] = collections.defaultdict(list)
    for b in stream.consumed:
        per_rank[b.rank].append((b.finished, b.version))
    for made in per_rank.values():
        versions = [v for _, v in sorted(made)]
        assert versions == sorted(versions)  # monotone per rank


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    k=st.integers(0, 2),
    order=st.sampled_from(["ready", "in_order"]),
    per_step=st.integers(1, 2),
    sleeps=st.lists(st.sampled_from([0.0, 0.003, 0.01, 0.05]), min_size=4, max_size=9),
)
def test_every_consumed_row_is_at_most_k_versions_old(
    groups: tuple[WorkerGroup, WorkerGroup], k: int, order: str, per_step: int, sleeps: list[float]
) -> None:
    trainer, rollout = groups
    trainer.reset()
    rollout.reset()
    stream = RolloutStream(
        rollout.generate, _prompts(sleeps), policy=MaxStaleness(k, order=order),
        batches_per_step=per_step, weights_from=trainer,
    )  # fmt: skip
    outs, steps = _run(trainer, rollout, stream)
    _check(outs, steps, stream, k, len(sleeps))
    assert stream.lost == []
    if order == "in_order":
        assert stream.evicted == []  # admission alone kept the bound: nothing reached take time stale


def test_a_raise_loses_only_that_batch_which_is_regenerated(
    groups: tuple[WorkerGroup, WorkerGroup], tmp_path: Path
) -> None:
    trainer, rollout = groups
    trainer.reset()
    rollout.reset(str(tmp_path))
    before = dispatchcore.driver_traffic()
    stream = RolloutStream(rollout.generate, _prompts([0.005] * 8), policy=MaxStaleness(1), weights_from=trainer)
    outs, steps = _run(trainer, rollout, stream)
    _check(outs, steps, stream, 1, 8)
    assert sorted(lost.seq for lost in stream.lost) == sorted({lost.seq for lost in stream.lost})
    assert len(stream.lost) == 2 and all(lost.regenerated for lost in stream.lost)  # batches 1 and 5
    assert all(isinstance(lost.error, WorkerError) and "broke" in str(lost.error) for lost in stream.lost)
    moved = dispatchcore.driver_traffic() - before
    results = sum(t.numel() * t.element_size() for out in outs for t in out.batch.values())
    assert moved.received_bytes == results  # only the trainer's results: generated rows went rank to rank
    assert moved.sent_bytes <= 10 * 2 * 2 * 8  # only the prompts went out (8 batches, 2 regenerated)


def test_close_leaves_nothing_generating_and_no_rows_kept(groups: tuple[WorkerGroup, WorkerGroup]) -> None:
    trainer, rollout = groups
    trainer.reset()
    gc.collect()  # earlier tests' steps are gone
    rollout.reset()
    before = rollout.kept()
    stream = RolloutStream(rollout.generate, _prompts([0.01, 0.3, 0.3, 0.3]), policy=MaxStaleness(2))
    step = stream.take(timeout=60)
    trainer.train(step.data)
    del step
    stream.close()  # waits for what runs; the batches not taken are dropped
    assert stream.in_flight == 0 and stream.ready == 0
    assert not stream._pump.is_alive()
    rollout.reset()  # the frees ride the group's next call
    assert rollout.kept() == before
    with pytest.raises(dispatchcore.StreamEnded, match="closed"):
        stream.take()


def test_drain_hands_over_what_runs_then_ends(groups: tuple[WorkerGroup, WorkerGroup]) -> None:
    trainer, rollout = groups
    trainer.reset()
    rollout.reset()
    stream = RolloutStream(rollout.generate, _prompts([0.05] * 6), policy=MaxStaleness(1), weights_from=trainer)
    trainer.train(stream.take(timeout=60).data)
    stream.publish(1)
    stream.drain()
    rest = list(stream)  # the batches already started, then the end
    started = {b.seq for b in stream.consumed}
    assert len(stream.consumed) == 1 + len(rest) and len(started) == len(stream.consumed)
    assert stream.in_flight == 0 and stream.lost == [] and stream.evicted == []
    with pytest.raises(dispatchcore.StreamEnded, match="ran out"):
        stream.take()
    stream.close()


def test_a_dead_rank_loses_its_batches_and_the_group_says_so(
    groups: tuple[WorkerGroup, WorkerGroup], tmp_path: Path
) -> None:
    trainer, rollout = groups  # one rank dies: the next test starts the groups again
    if rollout.backend == "local":
        pytest.skip("a local rank is a thread: it cannot die")
    trainer.reset()
    rollout.reset(str(tmp_path), die=True)
    stream = RolloutStream(rollout.generate, _prompts([0.005] * 4), policy=MaxStaleness(1), weights_from=trainer)
    with pytest.raises(dispatchcore.DispatchError, match=r"died"):  # no spares: the group is broken (core rule)
        _run(trainer, rollout, stream)
    assert isinstance(stream.lost[0].error, dispatchcore.WorkerDiedError) and stream.lost[0].regenerated
    assert "out@" in stream.describe()
    stream.close()
    assert not stream._pump.is_alive()


@pytest.mark.slow
def test_ray_keeps_the_bound(ray_session: Any) -> None:
    for pickler in (pytest.importorskip("cloudpickle"), pytest.importorskip("ray.cloudpickle")):
        pickler.register_pickle_by_value(sys.modules[__name__])
    with WorkerGroup(Trainer, 1, backend="ray") as trainer, WorkerGroup(Rollout, 2, backend="ray") as rollout:
        stream = RolloutStream(
            rollout.generate, _prompts([0.0, 0.05, 0.003, 0.01, 0.05, 0.0]), policy=MaxStaleness(1),
            weights_from=trainer,
        )  # fmt: skip
        outs, steps = _run(trainer, rollout, stream)
        _check(outs, steps, stream, 1, 6)
