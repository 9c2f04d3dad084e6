"""A running ``RolloutStream`` follows its rollout group: grown ranks join, shrunk ones leave, replaced ones return.

Each new or replaced rank is synced from ``weights_from`` to the trainer's
version before it generates (the rows' weights equal their stamp); batches
waiting on ranks that a shrink removes or renumbers are regenerated; nothing
is consumed twice or lost, and no row is more than ``k`` versions old.
"""

from __future__ import annotations

import collections
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from dispatchcore import (
    DataProto,
    Dispatch,
    MaxStaleness,
    RolloutStream,
    WorkerDiedError,
    WorkerGroup,
    register,
    versioned,
    weights_version_of,
)
from test_async_stream import Rollout, Trainer, _prompts

pytestmark = pytest.mark.timeout(180)


def _steps(trainer: WorkerGroup, stream: RolloutStream, count: int | None, outs: list[DataProto]) -> None:
    """Train on ``count`` steps (None: until the stream ends), publishing a version after each; keep no rows."""
    done = 0
    while count is None or done < count:
        try:
            step = stream.take(timeout=60)
        except Exception as exc:  # noqa: BLE001 - StreamEnded: the prompts ran out
            if count is None and type(exc).__name__ == "StreamEnded":
                return
            raise
        outs.append(trainer.train(step.data))
        del step  # the rows on the rollout ranks are freed: a shrink refuses while they are referenced
        stream.publish(stream.trainer_version + 1)
        done += 1


def _check_rows(outs: list[DataProto], stream: RolloutStream, k: int, n: int) -> DataProto:
    rows = DataProto.concat(outs)
    assert 0 <= int(rows.batch["staleness"].min()) and int(rows.batch["staleness"].max()) <= k
    assert torch.equal(rows.batch["wv"], rows.batch["version"].float())  # each row made with the weights it names
    pids = collections.Counter(int(p) for p in rows.batch["pid"][::2])
    given_up = sum(1 for e in stream.evicted if not e.regenerated)
    assert max(pids.values()) == 1 and len(pids) + given_up == n  # none twice, none lost
    return rows


@pytest.mark.parametrize("backend", ["local", "torchrun"])
def test_the_rollout_group_grows_and_shrinks_while_the_stream_runs(backend: str) -> None:
    n = 16
    with WorkerGroup(Trainer, 1, backend=backend) as trainer, WorkerGroup(Rollout, 2, backend=backend) as rollout:
        stream = RolloutStream(rollout.generate, _prompts([0.01] * n), policy=MaxStaleness(1), weights_from=trainer)
        outs: list[DataProto] = []
        with stream:
            _steps(trainer, stream, 3, outs)
            stream.grow(1)
            assert rollout.world_size == 3
            stream.wait_synced(timeout=60)  # the new rank is synced before it may generate
            assert stream.rank_versions()[2] == stream.trainer_version == 3
            _steps(trainer, stream, 4, outs)
            stream.shrink(0)  # ranks 1 and 2 become 0 and 1: what waited on them is made again
            assert rollout.world_size == 2 and stream.rank_versions() and len(stream.rank_versions()) == 2
            _steps(trainer, stream, None, outs)
        rows = _check_rows(outs, stream, 1, n)
        assert {int(r) for r in rows.batch["rank"]} >= {0, 1}
        assert all(lost.regenerated for lost in stream.lost)


def test_torchrun_a_replaced_rollout_rank_generates_again(tmp_path: Path) -> None:
    """``on_rank_death="replace"`` with spares: the dead rank's batch is regenerated; the new rank, synced, serves."""
    n = 8
    options: dict[str, Any] = {"backend": "torchrun", "on_rank_death": "replace", "spare_ranks": 2}
    with WorkerGroup(Trainer, 1, backend="torchrun") as trainer, WorkerGroup(Rollout, 2, **options) as rollout:
        rollout.reset(str(tmp_path), True)  # prompt batches 1 and 5 end their rank's process on their first try
        stream = RolloutStream(rollout.generate, _prompts([0.02] * n), policy=MaxStaleness(1), weights_from=trainer)
        outs: list[DataProto] = []
        with stream:
            _steps(trainer, stream, None, outs)
        _check_rows(outs, stream, 1, n)
        deaths = [lost for lost in stream.lost if isinstance(lost.error, WorkerDiedError)]
        assert deaths and all(lost.regenerated for lost in deaths)
        dead = {lost.rank for lost in deaths}
        first_death = min(lost.seq for lost in deaths)
        assert any(b.rank in dead and b.seq > first_death for b in stream.consumed)  # the replaced rank served again


class SlowOnce(Rollout):
    """Prompt batch 1's first try would run a minute, in short naps (a cancel lands between two); retries are quick."""

    @register(Dispatch.DP_COMPUTE_PROTO)
    @versioned
    def generate(self, prompts: DataProto) -> DataProto:
        pid = int(prompts.batch["pid"][0])
        marker = Path(str(self.fail_dir)) / f"slow-{pid}"
        if pid == 1 and not marker.exists():
            marker.touch()
            end = time.monotonic() + 60.0
            while time.monotonic() < end:
                time.sleep(0.01)
        n, version = len(prompts), weights_version_of(self) or 0
        return DataProto.from_dict(
            {
                "pid": prompts.batch["pid"].clone(),
                "version": torch.full((n,), version),
                "wv": torch.full((n,), float(self.w[0])),
                "rank": torch.full((n,), self.rank),
            }
        )


@pytest.mark.parametrize("backend", ["local", "torchrun"])
def test_interrupt_cancels_a_batch_that_could_no_longer_be_taken(backend: str, tmp_path: Path) -> None:
    """``interrupt=True``: at ``publish`` a running batch that the policy would evict is cancelled and requeued
    (no attempt counted) instead of finishing and being thrown away; the ranks keep no rows of it."""
    sleeps = [0.0] * 6  # batch 1's first try would run a minute (SlowOnce): ready-first taking overtakes it
    with WorkerGroup(Trainer, 1, backend=backend) as trainer, WorkerGroup(SlowOnce, 2, backend=backend) as rollout:
        rollout.reset(str(tmp_path))
        before = rollout.kept()
        policy = MaxStaleness(1, order="ready")
        stream = RolloutStream(
            rollout.generate, _prompts(sleeps), policy=policy, weights_from=trainer, interrupt=True
        )  # fmt: skip
        outs: list[DataProto] = []
        with stream:
            _steps(trainer, stream, None, outs)
        rows = _check_rows(outs, stream, 1, len(sleeps))
        assert 1 in stream.interrupted and stream.evicted == []  # cut at publish, not evicted at take time
        cut = [lost for lost in stream.lost if lost.seq in stream.interrupted]
        assert cut and all(lost.regenerated for lost in cut)
        assert int(rows.batch["staleness"].max()) <= 1
        rollout.reset()  # the frees ride the group's next call
        assert rollout.kept() == before
