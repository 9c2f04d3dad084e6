"""A step that fails in one rank leaves every process alive, its state intact, and the next collective working.

Three DP replicas all-reduce through ``dispatchcore.collective``; rank 1
raises before the all-reduce (for real, and as a ``Fault.raise_on`` the
driver simulates, where rank 1 never gets the call), or a step is cancelled
while the ranks wait in the collective.  The group's ``cancel_grace`` is far
past the tests' bound: a rank left in the collective would make the next
call wait for it and then refuse, so the next call answering proves the
abort freed it.
"""

from __future__ import annotations

import sys
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
from dispatchcore.testing import Fault
from faults._replica_workers import Replica as ReplicaSteps

cloudpickle.register_pickle_by_value(sys.modules[__name__])

BACKENDS = ["local", "torchrun", "ray"]
#: Past every test's timeout: a rank still stuck in the collective fails the test instead of being restarted.
GRACE_S = 600.0


class Replica(ReplicaSteps):
    """The shared replica, with the ways a step can be left unfinished."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def park(self, seconds: float) -> None:
        """Rank 1 sleeps in Python (a cancel interrupts it); the others wait for it in the all-reduce."""
        if self.rank == 1:
            import time

            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                time.sleep(0.01)
        collective.all_reduce(torch.ones(1))

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def reduce_without_rank_1(self, timeout: float) -> str:
        """Rank 1 skips the all-reduce: the others' ``timeout=`` ends it."""
        if self.rank == 1:
            return "skipped"
        try:
            collective.all_reduce(torch.ones(1), timeout=timeout)
        except Exception as exc:  # noqa: BLE001 - what the caller sees is the test's subject
            return type(exc).__name__
        return "finished"


def _group(backend: str, request: pytest.FixtureRequest, **options: Any) -> WorkerGroup[Any]:
    if backend == "ray":
        request.getfixturevalue("ray_session")
    return WorkerGroup(Replica, 3, backend=backend, cancel_grace=GRACE_S, **options)


def _recovered(wg: WorkerGroup[Any], pids: list[int], steps: int) -> None:
    """The same processes answer with the state they had, and a further step leaves the replicas equal."""
    assert wg.state() == [(pid, steps, 8.0 * steps) for pid in pids]
    assert wg.step() == [8.0 * (steps + 1)] * 3


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_rank_that_raises_before_the_all_reduce_leaves_the_group_whole(
    backend: str, request: pytest.FixtureRequest
) -> None:
    with _group(backend, request) as wg:
        assert wg.step() == [8.0] * 3
        pids = [state[0] for state in wg.state()]
        with pytest.raises(WorkerError) as raised:
            wg.step(failing_rank=1)
        assert raised.value.rank == 1
        assert raised.value.exc_type == "ValueError"
        _recovered(wg, pids, 1)


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("backend", ["torchrun", "ray"])
def test_a_fault_the_driver_injects_frees_the_ranks_it_left_in_the_all_reduce(
    backend: str, request: pytest.FixtureRequest
) -> None:
    """``Fault.raise_on``: rank 1 never gets the call; the cancel of the others aborts the group on rank 1 too."""
    if backend == "ray":
        request.getfixturevalue("ray_session")
    faults = [Fault.raise_on(1, "step", call=2)]
    with WorkerGroup(Replica, 3, backend="faulty", inner=backend, faults=faults, cancel_grace=GRACE_S) as wg:
        assert wg.step() == [8.0] * 3
        pids = [state[0] for state in wg.state()]
        with pytest.raises(WorkerError) as raised:
            wg.step()
        assert raised.value.rank == 1
        _recovered(wg, pids, 1)


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_step_cancelled_on_timeout_inside_the_all_reduce_leaves_the_group_whole(
    backend: str, request: pytest.FixtureRequest
) -> None:
    with _group(backend, request) as wg:
        assert wg.step() == [8.0] * 3
        pids = [state[0] for state in wg.state()]
        with pytest.raises(DispatchTimeoutError) as raised:
            wg.park.options(timeout=2, on_timeout="cancel")(GRACE_S)
        assert any("cancelled on its ranks" in note for note in raised.value.__notes__)
        _recovered(wg, pids, 1)


@pytest.mark.timeout(120)
def test_a_cancelled_local_step_releases_the_ranks_waiting_in_memory() -> None:
    with WorkerGroup(Replica, 3, backend="local", cancel_grace=GRACE_S) as wg:
        future = wg.park.options(blocking=False)(GRACE_S)
        assert future.cancel()
        with pytest.raises(CallCancelledError):
            future.get()
        assert [state[1:] for state in wg.state()] == [(0, 0.0)] * 3
        assert wg.step() == [8.0] * 3


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_collectives_own_timeout_bounds_it_and_the_next_one_works() -> None:
    with WorkerGroup(Replica, 3, backend="torchrun", cancel_grace=GRACE_S) as wg:
        assert wg.step() == [8.0] * 3
        assert wg.reduce_without_rank_1(1.0) == ["DispatchTimeoutError", "skipped", "DispatchTimeoutError"]
        assert wg.step() == [16.0] * 3
