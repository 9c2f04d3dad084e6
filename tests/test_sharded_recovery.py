"""FSDP2 groups through a failed step: checked on every rank before the next call, recovered by the worker's hook.

A raise inside backward on one rank leaves FSDP2 mid-step; the library sees
it before the next call, runs ``recover_sharded_state`` on every rank, and
the steps after it end exactly where a clean run resumed from the same
checkpoint ends.  A NaN guard raising after backward leaves FSDP2 idle: the
next call runs at once, with no rebuild.  A hook that forgets the optimizer,
or no hook, refuses the next call by name.
"""

from __future__ import annotations

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


def _recovers_like_a_resumed_run(wg: WorkerGroup[Any], checkpoint: Path) -> None:
    wg.step(1)
    wg.save(str(checkpoint))
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
    with WorkerGroup(ShardedTrainer, 2, backend="torchrun", cancel_grace=GRACE_S) as wg:
        _recovers_like_a_resumed_run(wg, tmp_path / "step1")
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


@pytest.mark.timeout(300)
def test_an_hsdp_group_on_the_users_own_mesh_recovers_the_same_way(tmp_path: Path) -> None:
    with WorkerGroup(ShardedTrainer, 4, backend="torchrun", cancel_grace=GRACE_S, init_args=((2, 2),)) as wg:
        _recovers_like_a_resumed_run(wg, tmp_path / "step1")


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_without_a_hook_the_next_call_is_refused_naming_it() -> None:
    with WorkerGroup(WithoutHook, 2, backend="torchrun", cancel_grace=GRACE_S) as wg:
        wg.step(1)
        _fail_inside_backward(wg, 2)
        with pytest.raises(DispatchError, match=r"Define WithoutHook.recover_sharded_state\(\)") as raised:
            wg.step(2)
        assert "mid-step" in str(raised.value)
