"""FSDP2 groups through a failed step: checked on every rank before the next call, recovered by the worker's hook.

A raise inside backward on one rank leaves FSDP2 mid-step; the library sees
it before the next call, runs ``recover_sharded_state`` on every rank, and
the steps after it end exactly where a clean run resumed from the same
checkpoint ends.  A NaN guard raising after backward leaves FSDP2 idle: the
next call runs at once, with no rebuild.  A hook that forgets the optimizer,
or no hook, refuses the next call by name.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from dispatchcore import DispatchError, WorkerError, WorkerGroup
from sharded_workers import ShardedTrainer, WithoutHook

GRACE_S = 600.0


def _fail_inside_backward(wg: WorkerGroup[Any], seed: int) -> None:
    with pytest.raises(WorkerError) as raised:
        wg.step(seed, fail_in_backward=1)
    assert raised.value.rank == 1


def _recovers_like_a_resumed_run(wg: WorkerGroup[Any]) -> None:
    # FSDP2's private state where the check reads it: a torch release that moves it fails here, by name.
    fresh = (("model", "SHARDED"), ("model.0", "SHARDED"), ("optimizer", "4"))
    assert [(report.signature, report.problems) for report in wg.check()] == [(fresh, ())] * wg.world_size
    wg.step(1)
    wg.save()
    _fail_inside_backward(wg, 2)
    after_fault = [wg.step(seed) for seed in (2, 3)]
    weights = wg.fingerprint()
    assert [rebuilds for _, rebuilds in weights] == [1] * wg.world_size  # the hook ran once, on every rank
    wg.resume()  # a clean run resumed from the same checkpoint
    assert [wg.step(seed) for seed in (2, 3)] == after_fault
    assert [digest for digest, _ in wg.fingerprint()] == [digest for digest, _ in weights]
    assert len({digest for digest, _ in weights}) == 1


@pytest.mark.timeout(240)
def test_a_raise_inside_backward_is_recovered_by_the_hook_and_a_nan_guard_is_not(tmp_path: Path) -> None:
    with WorkerGroup(ShardedTrainer, 2, backend="torchrun", cancel_grace=GRACE_S, init_args=(str(tmp_path),)) as wg:
        _recovers_like_a_resumed_run(wg)
        rebuilt = wg.fingerprint()
        with pytest.raises(WorkerError):
            wg.step(4, nan_guard=1)  # after backward: FSDP2 is idle, the optimizer untouched
        wg.step(4)
        assert [rebuilds for _, rebuilds in wg.fingerprint()] == [rebuilds for _, rebuilds in rebuilt]
        wg.reference_forward()  # the root stays unsharded on every rank alike: fit
        wg.set_forget_optimizer(True)
        _fail_inside_backward(wg, 5)
        with pytest.raises(DispatchError, match=r"ShardedTrainer.recover_sharded_state\(\) ran on every rank") as e:
            wg.step(5)
        assert "optimizer holds" in str(e.value)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_ray_a_raise_inside_backward_is_recovered_by_the_hook(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    request.getfixturevalue("ray_session")
    with WorkerGroup(ShardedTrainer, 2, backend="ray", cancel_grace=GRACE_S, init_args=(str(tmp_path),)) as wg:
        _recovers_like_a_resumed_run(wg)


LAUNCHED = """
import sys
sys.path.insert(0, {tests!r})
from dispatchcore import WorkerGroup
import test_sharded_recovery as case
from sharded_workers import ShardedTrainer

with WorkerGroup(ShardedTrainer, backend="torchrun", cancel_grace=case.GRACE_S, init_args=({path!r},)) as wg:
    case._recovers_like_a_resumed_run(wg)
    print("recovered")
"""


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.skipif(shutil.which("torchrun") is None, reason="torchrun is not on PATH")
def test_under_the_launcher_a_raise_inside_backward_is_recovered_by_the_hook(tmp_path: Path) -> None:
    script = tmp_path / "launched.py"
    script.write_text(LAUNCHED.format(tests=str(Path(__file__).parent), path=str(tmp_path / "checkpoint")))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHELASTIC", "RANK", "MASTER_"))}
    command = [shutil.which("torchrun") or "torchrun", "--standalone", "--nproc-per-node=2", str(script)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=280, env=env, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.splitlines() == ["recovered"]


@pytest.mark.timeout(300)
def test_an_hsdp_group_on_the_users_own_mesh_recovers_the_same_way(tmp_path: Path) -> None:
    options: dict[str, Any] = {"cancel_grace": GRACE_S, "init_args": (str(tmp_path), (2, 2))}
    with WorkerGroup(ShardedTrainer, 4, backend="torchrun", **options) as wg:
        _recovers_like_a_resumed_run(wg)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_without_a_hook_the_next_call_is_refused_naming_it(tmp_path: Path) -> None:
    with WorkerGroup(WithoutHook, 2, backend="torchrun", cancel_grace=GRACE_S, init_args=(str(tmp_path),)) as wg:
        wg.step(1)
        _fail_inside_backward(wg, 2)
        with pytest.raises(DispatchError, match=r"Define WithoutHook.recover_sharded_state\(\)") as raised:
            wg.step(2)
        assert "mid-step" in str(raised.value)


def _replaced_rank_trains_on_like_a_resumed_run(wg: WorkerGroup[Any]) -> None:
    wg.step(1)
    wg.save()
    wg.reference_forward()  # the survivors' root stays unsharded; a new rank's is sharded
    old = wg.pid()
    os.kill(old[1], signal.SIGKILL)
    wg.replace_rank(1)
    assert wg.pid()[0] == old[0] and wg.pid()[1] != old[1]
    after = [wg.step(seed) for seed in (2, 3)]
    weights = [digest for digest, _ in wg.fingerprint()]
    wg.resume()
    assert [wg.step(seed) for seed in (2, 3)] == after
    assert [digest for digest, _ in wg.fingerprint()] == weights


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_torchrun_a_replaced_fsdp2_rank_lines_up_with_the_survivors(tmp_path: Path) -> None:
    options: dict[str, Any] = {"spare_ranks": 1, "death_timeout": 5, "init_args": (str(tmp_path),)}
    with WorkerGroup(ShardedTrainer, 2, backend="torchrun", cancel_grace=GRACE_S, **options) as wg:
        _replaced_rank_trains_on_like_a_resumed_run(wg)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_ray_a_replaced_fsdp2_rank_lines_up_with_the_survivors(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    request.getfixturevalue("ray_session")
    options: dict[str, Any] = {"death_timeout": 5, "init_args": (str(tmp_path),)}
    with WorkerGroup(ShardedTrainer, 2, backend="ray", cancel_grace=GRACE_S, **options) as wg:
        _replaced_rank_trains_on_like_a_resumed_run(wg)
