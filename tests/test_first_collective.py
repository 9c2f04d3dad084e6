"""A step that fails before the group's first collective ever ran: the next call runs at once, state kept.

Rank 1 raises (or sleeps until a cancel, or until the call's timeout cancels
it) while rank 0 is already in the group's first ``all_reduce``, still
building the communicator rank 1 never joins.  The call left behind in the
store must not hold up the next one: it answers well inside its own bound
(far below the collective's 300 s), from the same processes, and the
replicas stay equal.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import cloudpickle
import pytest
import torch

from dispatchcore import (
    CallCancelledError,
    Dispatch,
    DispatchTimeoutError,
    WorkerError,
    WorkerGroup,
    collective,
    register,
)
from faults._replica_workers import Replica as ReplicaSteps

cloudpickle.register_pickle_by_value(sys.modules[__name__])

#: Past every test's timeout: a rank left stuck fails the test instead of being restarted.
GRACE_S = 600.0
#: The next call's bound: far below the collective's own 300 s, which the stuck case waited out.
NEXT_CALL_S = 30.0
FAULTS = ["raise", "cancel", "on_timeout"]


class Replica(ReplicaSteps):
    """The shared replica, and a step whose rank 1 sleeps in Python while rank 0 waits in the all-reduce."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def park(self, seconds: float) -> None:
        if self.rank == 1:
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                time.sleep(0.01)
        collective.all_reduce(torch.ones(1))


def _fail_first_step(wg: WorkerGroup[Any], fault: str) -> None:
    if fault == "raise":
        with pytest.raises(WorkerError) as raised:
            wg.step(failing_rank=1)
        assert raised.value.rank == 1
    elif fault == "cancel":
        future = wg.park.options(blocking=False)(GRACE_S)
        time.sleep(0.5)  # rank 0 is in the all-reduce by now (or the cancel finds it on its way)
        assert future.cancel()
        with pytest.raises(CallCancelledError):
            future.get()
    else:
        with pytest.raises(DispatchTimeoutError):
            wg.park.options(timeout=1, on_timeout="cancel")(GRACE_S)


def _check_first_step_recovers(wg: WorkerGroup[Any], fault: str) -> None:
    pids = [state[0] for state in wg.state()]
    _fail_first_step(wg, fault)
    assert wg.step.options(timeout=NEXT_CALL_S)() == [6.0, 6.0]  # grads 1 and 2, averaged over 4 weights
    assert wg.state() == [(pid, 1, 6.0) for pid in pids]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("fault", FAULTS)
def test_torchrun_first_step_failing_on_one_rank_does_not_hold_up_the_next(fault: str) -> None:
    with WorkerGroup(Replica, 2, backend="torchrun", cancel_grace=GRACE_S) as wg:
        _check_first_step_recovers(wg, fault)


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("fault", FAULTS)
def test_ray_first_step_failing_on_one_rank_does_not_hold_up_the_next(
    fault: str, request: pytest.FixtureRequest
) -> None:
    request.getfixturevalue("ray_session")
    with WorkerGroup(Replica, 2, backend="ray", cancel_grace=GRACE_S) as wg:
        _check_first_step_recovers(wg, fault)


LAUNCHED = """
import sys, time
sys.path.insert(0, {tests!r})
from dispatchcore import WorkerGroup
import test_first_collective as first

for fault in first.FAULTS:
    with WorkerGroup(first.Replica, backend="torchrun", cancel_grace=first.GRACE_S) as wg:
        first._check_first_step_recovers(wg, fault)
        print("recovered", fault)
"""


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.skipif(shutil.which("torchrun") is None, reason="torchrun is not on PATH")
def test_under_the_launcher_a_first_step_failing_on_one_rank_does_not_hold_up_the_next(tmp_path: Path) -> None:
    script = tmp_path / "launched.py"
    script.write_text(LAUNCHED.format(tests=str(Path(__file__).parent)))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHELASTIC", "RANK", "MASTER_"))}
    command = [shutil.which("torchrun") or "torchrun", "--standalone", "--nproc-per-node=2", str(script)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=280, env=env, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.splitlines() == [f"recovered {fault}" for fault in FAULTS]
