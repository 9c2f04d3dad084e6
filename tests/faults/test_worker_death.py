"""A rank's process dies: ``os._exit`` or SIGKILL (as the OOM killer does it), idle or mid-call.

Process backends only (local ranks are threads: nothing can kill one alone).
Each case has a fresh group of two ranks.  Mid-call, the other rank is
computing for an hour, far past this module's timeout: the test passes only
if the death ends the call by itself, and the time from the moment of death
(watched on the rank's pid) to the error is recorded against
``death_timeout``.  Afterwards the group refuses calls saying why,
``shutdown()`` ends the surviving rank too, and nothing is left behind.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any

import pytest

from dispatchcore import DispatchError, WorkerDiedError, WorkerGroup

from ._harness import (
    DEATH_TIMEOUT,
    FAULT_TABLE,
    PROCESS_BACKENDS,
    DeathWatch,
    alive,
    backend_params,
    fault_row,
    full_only,
)
from ._leaks import Snapshot, settle, timed
from ._workers import FaultWorker

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(120),  # the bound: the surviving rank computes for an hour
    pytest.mark.parametrize("backend", backend_params(PROCESS_BACKENDS), indirect=True),
]

DEAD = 1  # the rank that dies; rank 0 survives


def _plant(wg: Any, when: str, how: str, pid: int) -> tuple[str, DeathWatch]:
    """Kill rank ``DEAD``; returns the method whose call sees it and the watch on its pid."""
    watch = DeathWatch(pid)
    if when == "idle":
        if how == "kill":
            os.kill(pid, signal.SIGKILL)
        else:
            wg.exit_later(DEAD, 0.2)  # after it answered
        watch.wait()
        return "ping", watch
    if how == "kill":  # from outside, half a second into a call both ranks are running
        threading.Timer(0.5, os.kill, args=(pid, signal.SIGKILL)).start()
        return "hang", watch
    return "die_on", watch  # the rank exits by itself half a second into the call


#: CI runs each kind of death and each moment once per backend; the full run, every pair.
CASES = [
    pytest.param("idle", "kill", id="idle-kill"),
    pytest.param("mid-call", "exit", id="mid-call-exit"),
    pytest.param("idle", "exit", id="idle-exit", marks=full_only),
    pytest.param("mid-call", "kill", id="mid-call-kill", marks=full_only),
]


@pytest.mark.parametrize(("when", "how"), CASES)
def test_a_dead_rank_is_reported_with_its_rank_from_the_moment_of_death(
    backend: str, when: str, how: str, record: Any
) -> None:
    ray = backend == "ray"
    before = Snapshot.take(ray=ray)
    wg = WorkerGroup(FaultWorker, 2, backend=backend, death_timeout=DEATH_TIMEOUT)
    try:
        pids = wg.pid()
        method, watch = _plant(wg, when, how, pids[DEAD])
        other: list[BaseException | object] = []  # a second driver thread, queued behind the call
        queued = threading.Thread(target=lambda: other.append(timed(lambda: wg.tagged([1, 2]))[1]))
        if when == "mid-call":
            threading.Timer(0.2, queued.start).start()
        started = time.monotonic()
        with pytest.raises(WorkerDiedError) as info:
            if method == "ping":
                wg.ping()
            elif method == "hang":
                wg.hang()
            else:
                wg.die_on(DEAD, "exit", 0.5)
        seen = time.monotonic()
        error = info.value
        assert (error.rank, error.method) == (DEAD, method)
        assert f"rank {DEAD} died while running {method!r}" in str(error)
        died = watch.wait()
        with pytest.raises(DispatchError, match=f"no more calls: rank {DEAD} died"):
            wg.ping()
        if when == "mid-call":
            assert alive(pids[0]), "the surviving rank is still in the call until shutdown"
            queued.join()  # every waiting caller is released (the test's timeout is the bound)
            (outcome,) = other
            assert isinstance(outcome, DispatchError), outcome  # died in its call, or refused: broken
            if isinstance(outcome, WorkerDiedError):
                assert (outcome.rank, outcome.method) == (DEAD, "tagged")
    finally:
        stop_started = time.monotonic()
        wg.shutdown()
        shutdown_s = time.monotonic() - stop_started
    leaks = settle(before, ray=ray)
    record(
        FAULT_TABLE.format(backend=backend),
        **fault_row(
            f"rank process {'exits (os._exit)' if how == 'exit' else 'SIGKILLed'} {when}",
            error,
            max(0.0, seen - max(died, started)),  # Ray may report it before our 2 ms poll sees the pid go
            DEATH_TIMEOUT,
            f"no: broken, says rank {DEAD} died; shutdown {shutdown_s:.2f} s",
            leaks,
        ),
    )
    assert not leaks
