"""Where is each rank? ``wg.rank_stacks()`` and timed-out calls show the stack of a busy or blocked method.

Structure, never timing: a call is started, the stacks are read until they
name the function the rank is in (pytest-timeout bounds the wait), then the
call is let finish.  Busy in Python and blocked in C (``time.sleep``) alike.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from dispatchcore import Dispatch, DispatchTimeoutError, Worker, WorkerGroup, register
from executors_ray.testing import ray_session  # noqa: F401

BACKENDS = ["local", "mock", "torchrun", "ray", "multiprocess"]
pytestmark = pytest.mark.timeout(120)

# The worker class travels by value: Ray's worker processes cannot import this test module.
for _pickler in (pytest.importorskip("cloudpickle"), pytest.importorskip("ray.cloudpickle")):
    _pickler.register_pickle_by_value(sys.modules[__name__])


def spin_in_python(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


def sleep_in_c(seconds: float) -> None:
    time.sleep(seconds)


class Stuck(Worker):
    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def busy(self, seconds: float) -> int:
        spin_in_python(seconds)
        return self.rank

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def blocked(self, seconds: float) -> int:
        sleep_in_c(seconds)
        return self.rank

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def hang(self, seconds: float) -> None:
        sleep_in_c(seconds)


@pytest.fixture(scope="module", params=BACKENDS)
def group(request: pytest.FixtureRequest) -> Iterator[WorkerGroup[Any]]:
    if request.param == "ray":
        request.getfixturevalue("ray_session")
    with WorkerGroup(Stuck, 2, backend=request.param) as wg:
        yield wg


def _wait_for(wg: WorkerGroup[Any], function: str) -> dict[int, str]:
    """Read the stacks until every rank of the call (``mock``: the one running) shows ``function``."""
    while True:
        stacks = wg.rank_stacks()
        assert stacks, f"backend {wg.backend!r} answered no rank's stack"
        running = [text for text in stacks.values() if function in text]
        if running and (wg.backend == "mock" or len(running) == len(stacks) == wg.world_size):
            return stacks
        time.sleep(0.05)


@pytest.mark.parametrize("method, function", [("busy", "spin_in_python"), ("blocked", "sleep_in_c")])
def test_the_stacks_name_the_function_a_rank_is_in(group: WorkerGroup[Any], method: str, function: str) -> None:
    future = getattr(group, method)(1.5)
    stacks = _wait_for(group, function)
    assert set(stacks) <= set(group.rank_ids)
    assert all("running the worker's methods" in text for text in stacks.values())
    assert future.get() == [0, 1]  # the stacks were read beside the call, which ran on


def test_all_threads_lists_more_than_the_method_thread(group: WorkerGroup[Any]) -> None:
    stacks = group.rank_stacks(all_threads=True)
    assert set(stacks) == set(group.rank_ids)
    assert all(text.count("thread '") >= 2 for text in stacks.values())


@pytest.mark.parametrize("backend", ["local", "torchrun", "ray", "multiprocess"])
def test_a_timed_out_call_says_where_its_ranks_are(backend: str, request: pytest.FixtureRequest) -> None:
    if backend == "ray":
        request.getfixturevalue("ray_session")
    wg = WorkerGroup(Stuck, 2, backend=backend)
    try:
        with pytest.raises(DispatchTimeoutError) as info:
            wg.hang.options(timeout=1)(60)
        notes = "\n".join(getattr(info.value, "__notes__", []))
        assert "sleep_in_c" in notes and "rank 0" in notes and "rank 1" in notes
    finally:
        wg.shutdown()
