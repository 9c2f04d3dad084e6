"""A training step that fails inside a ``dispatchcore.collective`` all-reduce leaves every process taking calls.

Two data-parallel replicas all-reduce a gradient each step.  The step fails
four ways: rank 1 raises before the all-reduce, the step is cancelled, its
``on_timeout="cancel"`` deadline passes, or Ctrl-C reaches the driver; in
the last three rank 1 is still in Python while rank 0 waits in the
all-reduce.  On torchrun, a step is also cancelled while both ranks sleep
in C (``time.sleep``).  The group's ``cancel_grace`` is past the tests'
timeout: a rank left in the call would make the next call wait and fail,
so the next call answering from the same pids, with the state as it was,
proves the ranks left it.  The rows give the time to the error and to the
next call's answer.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import cloudpickle
import pytest
import torch

from dispatchcore import CallCancelledError, Dispatch, DispatchTimeoutError, WorkerGroup, collective, register

from ._harness import FAULT_TABLE, backend_params, ctrl_c_after, fault_row, full_only
from ._leaks import Snapshot, settle, timed
from ._replica_workers import Replica as ReplicaSteps

cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.timeout(120)

#: Past every test's timeout: a rank still in the step fails the test instead of being restarted.
GRACE_S = 600.0
#: How long rank 1 stays in Python (or a rank in C) unless the fault ends the step.
HOUR = 3600.0
#: ``on_timeout="cancel"``'s deadline, and when Ctrl-C comes.
DEADLINE_S = 1.0
#: Each replica's weights after ``n`` steps sum to ``6 * n`` (the average of 1 and 2, over 4 elements).
PER_STEP = 6.0
#: Backends whose ranks share the driver's process group: a terminal's Ctrl-C reaches them too.
SAME_PROCESS_GROUP = ("torchrun",)


class Replica(ReplicaSteps):
    """The shared replica, with the ways a step can be left unfinished."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def late_step(self) -> None:
        """Rank 1 stays in Python (a cancel interrupts it) while rank 0 waits for it in the all-reduce."""
        if self.rank == 1:
            deadline = time.monotonic() + HOUR
            while time.monotonic() < deadline:
                time.sleep(0.01)
        collective.all_reduce(torch.ones(1))

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def sleep_in_c(self) -> None:
        time.sleep(HOUR)


@pytest.fixture(scope="module", params=backend_params(("local", "torchrun", "ray")))
def replicas(request: pytest.FixtureRequest) -> Iterator[WorkerGroup[Any]]:
    """One group per backend for every case: each fault must leave it taking calls."""
    if request.param == "ray":
        request.getfixturevalue("ray_session")
    with WorkerGroup(Replica, 2, backend=request.param, cancel_grace=GRACE_S) as wg:
        wg.step()
        yield wg


def _before(wg: WorkerGroup[Any]) -> tuple[list[tuple[int, int, float]], Snapshot]:
    """Each rank's (pid, steps, weights' sum), and what the driver holds, before the fault."""
    return wg.state(), Snapshot.take(ray=wg.backend == "ray")


def _next_step_from_the_same_processes(wg: WorkerGroup[Any], before: list[tuple[int, int, float]]) -> float:
    """The same pids answer with their state as it was, then a step leaves the replicas equal; its seconds."""
    seconds, state = timed(wg.state)
    assert state == before, state
    steps = before[0][1] + 1
    assert wg.step() == [PER_STEP * steps] * 2
    return seconds


def _record(
    record: Any,
    wg: WorkerGroup[Any],
    snapshot: Snapshot,
    fault: str,
    error: BaseException,
    seconds: float,
    bound: Any,
    next_s: float,
) -> None:
    usable = (
        f"yes: the next call answered in {next_s:.2f} s from the same processes, state kept "
        f"({seconds + next_s:.2f} s with the failed step); the next all-reduce ran"
    )
    leaks = settle(snapshot, ray=wg.backend == "ray")
    record(FAULT_TABLE.format(backend=wg.backend), **fault_row(fault, error, seconds, bound, usable, leaks))
    assert not leaks


def _cancelled(wg: WorkerGroup[Any], method: str, in_function: str) -> tuple[BaseException, float]:
    """Start ``method``, wait until a rank is in ``in_function``, cancel; (the error, seconds from the cancel)."""
    future = getattr(wg, method).options(blocking=False)()
    while not any(f"in {in_function}" in text for text in wg.rank_stacks().values()):
        time.sleep(0.05)
    cancelled_at = time.monotonic()
    assert future.cancel() is True
    with pytest.raises(CallCancelledError) as raised:
        future.get()
    return raised.value, time.monotonic() - cancelled_at


def test_a_rank_that_raises_before_the_all_reduce(replicas: WorkerGroup[Any], record: Any) -> None:
    before, snapshot = _before(replicas)
    seconds, error = timed(lambda: replicas.step(failing_rank=1))
    assert (getattr(error, "rank", None), getattr(error, "exc_type", None)) == (1, "ValueError"), error
    next_s = _next_step_from_the_same_processes(replicas, before)
    fault = "rank raises ValueError before a dispatchcore.collective all_reduce (rank 0 in it; default options)"
    _record(record, replicas, snapshot, fault, error, seconds, "-", next_s)


def test_a_step_cancelled_inside_the_all_reduce(replicas: WorkerGroup[Any], record: Any) -> None:
    before, snapshot = _before(replicas)
    error, seconds = _cancelled(replicas, "late_step", "all_reduce")
    next_s = _next_step_from_the_same_processes(replicas, before)
    fault = "future.cancel() of a step: rank 0 in a dispatchcore.collective all_reduce, rank 1 in Python"
    _record(record, replicas, snapshot, fault, error, seconds, "-", next_s)


@full_only  # CI has it in tests/test_collective_abort.py
def test_a_step_past_its_deadline_with_on_timeout_cancel(replicas: WorkerGroup[Any], record: Any) -> None:
    before, snapshot = _before(replicas)
    late_step: Callable[[], Any] = replicas.late_step.options(timeout=DEADLINE_S, on_timeout="cancel")
    seconds, error = timed(late_step)
    assert isinstance(error, DispatchTimeoutError), error
    assert any("cancelled on its ranks" in note for note in error.__notes__)
    next_s = _next_step_from_the_same_processes(replicas, before)
    fault = f'on_timeout="cancel" ({DEADLINE_S:g} s) of a step: rank 0 in a dispatchcore.collective all_reduce'
    _record(record, replicas, snapshot, fault, error, seconds, DEADLINE_S, next_s)


def test_ctrl_c_of_a_step_inside_the_all_reduce(replicas: WorkerGroup[Any], record: Any) -> None:
    before, snapshot = _before(replicas)
    ranks = tuple(pid for pid, _, _ in before) if replicas.backend in SAME_PROCESS_GROUP else ()
    with ctrl_c_after(DEADLINE_S, also=ranks) as sent, pytest.raises(KeyboardInterrupt) as raised:
        replicas.late_step()
    seconds = time.monotonic() - sent[0]
    next_s = _next_step_from_the_same_processes(replicas, before)
    where = "ranks got SIGINT too" if ranks else "driver only"
    fault = f"Ctrl-C of a step: rank 0 in a dispatchcore.collective all_reduce ({where})"
    _record(record, replicas, snapshot, fault, raised.value, seconds, "-", next_s)


def test_a_step_cancelled_while_the_ranks_sleep_in_c(replicas: WorkerGroup[Any], record: Any) -> None:
    if replicas.backend != "torchrun":
        pytest.skip("only torchrun's self-started ranks run methods on a main thread a signal can interrupt")
    before, snapshot = _before(replicas)
    error, seconds = _cancelled(replicas, "sleep_in_c", "sleep_in_c")
    next_s = _next_step_from_the_same_processes(replicas, before)
    fault = "future.cancel() while every rank is in time.sleep(3600) (a signal ends it after 1 s)"
    _record(record, replicas, snapshot, fault, error, seconds, "-", next_s)
