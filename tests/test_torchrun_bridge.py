"""torchrun weight transfers over bridges: two worlds, one world's colocated roles, a replaced rank, the launcher.

The two-separate-worlds case and the death cases are in the conformance
suite (``tests/test_torchrun_conformance.py``); these add what only torchrun
has.  No wall-clock thresholds: each case checks values, the transport and
that no byte crossed the driver.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from _stranger import knock_as_another_user
from dispatchcore import Dispatch, WeightSync, WorkerGroup, create_colocated_worker_cls, driver_traffic, register
from dispatchcore.testing.weight_workers import WeightRollout, WeightTrainer, expected, make_weights

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

ROOT = Path(__file__).resolve().parents[1]


def _check(dst: Any, cut: int | None, version: Any) -> None:
    for rank, (got, seen, _) in enumerate(dst.state()):
        assert seen == version or version is None
        for name, full in make_weights().items():
            want = expected(full, cut, rank, dst.world_size)
            assert got[name].dtype == want.dtype and torch.equal(got[name], want), (name, rank)


def _sync(src: Any, dst: Any, version: Any, cut: int | None = None) -> None:
    dst.configure(cut=cut)
    before = driver_traffic()
    report = WeightSync(src, dst, bucket_bytes=100)(version=version)
    assert report.transport == "torchrun" and report.driver_bytes == 0
    assert (driver_traffic() - before).total == 0
    _check(dst, cut, version)


class _Trainer(WeightTrainer):
    """A colocated role's methods must be registered to exist on the colocated class (a core gap, not torchrun's)."""

    @register(Dispatch.ONE_TO_ALL)
    def weights(self) -> Any:
        return super().weights()


class _Rollout(WeightRollout):
    @register(Dispatch.ONE_TO_ALL)
    def weight_slices(self, shapes: Any) -> Any:
        return super().weight_slices(shapes)

    @register(Dispatch.ONE_TO_ALL)
    def load_weights(self, weights: Any) -> None:
        super().load_weights(weights)


@pytest.fixture(scope="module")
def roles() -> Iterator[dict[str, Any]]:
    cls = create_colocated_worker_cls({"trainer": _Trainer, "rollout": _Rollout})
    with WorkerGroup(cls, 2, backend="torchrun", death_timeout=10) as wg:
        yield wg.spawn({"trainer", "rollout"})


@pytest.mark.parametrize("cut", [None, 0])
def test_colocated_roles_in_one_world(roles: dict[str, Any], cut: int | None) -> None:
    """Rank i to rank i stays in its process; rank i to rank j bridges two processes of one world."""
    # The version lands on the colocated class's instance, not the role's (core gap): values only.
    _sync(roles["trainer"], roles["rollout"], version=None, cut=cut)


def test_a_replaced_source_rank_gets_new_bridges() -> None:
    with (
        WorkerGroup(WeightTrainer, 2, backend="torchrun", spare_ranks=1, death_timeout=10) as src,
        WorkerGroup(WeightRollout, 2, backend="torchrun", death_timeout=10) as dst,
    ):
        _sync(src, dst, version=1)
        pid = src.set_step(0)[1]
        _a_stranger_gets_no_bridge(pid)
        _sync(src, dst, version=1)
        os.kill(pid, signal.SIGKILL)
        src.replace_rank(1)
        assert src.set_step(0)[1] != pid
        _sync(src, dst, version=2, cut=1)


def _a_stranger_gets_no_bridge(pid: int) -> None:
    """Another user knocks on every port the source process listens on (its bridge door among them): refused."""
    verdicts = knock_as_another_user(pid)
    assert "admitted" not in verdicts.values(), verdicts
    assert "refused" in verdicts.values(), f"the source's bridge door should greet and refuse: {verdicts}"


LAUNCHED = textwrap.dedent(
    """
    import torch
    from dispatchcore import WeightSync, WorkerGroup, driver_traffic
    from dispatchcore.testing.weight_workers import WeightRollout, WeightTrainer, expected, make_weights

    src = WorkerGroup(WeightTrainer, 2, backend="torchrun", ranks=[0, 1])
    dst = WorkerGroup(WeightRollout, 2, backend="torchrun", ranks=[2, 3])
    dst.configure(cut=0)
    report = WeightSync(src, dst, bucket_bytes=100)(version=7)
    assert report.transport == "torchrun" and driver_traffic().total == 0, (report, driver_traffic())
    for rank, (got, seen, _) in enumerate(dst.state()):
        assert seen == 7
        for name, full in make_weights().items():
            assert torch.equal(got[name], expected(full, 0, rank, 2)), name
    print("bridged", report.buckets)
    """
)


@pytest.mark.skipif(shutil.which("torchrun") is None, reason="torchrun is not on PATH")
def test_under_the_launcher(tmp_path: Path) -> None:
    script = tmp_path / "driver.py"
    script.write_text(LAUNCHED)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHELASTIC", "RANK", "MASTER_"))}
    env["PYTHONUNBUFFERED"] = "1"
    command = [shutil.which("torchrun") or "torchrun", "--standalone", "--nproc-per-node=4", str(script)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=200, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "bridged" in done.stdout
