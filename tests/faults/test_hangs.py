"""A rank is slow, or hangs: with no call timeout the call waits (Ctrl-C ends the wait), with one it fails.

Two fresh groups per backend.  The first has ``death_timeout=1``, far below
the slow rank's time (a slow rank taken for a dead one fails the test): a
slow call completes; a hang without a timeout waits until Ctrl-C
(``KeyboardInterrupt``; the interrupted call runs on), then the group is
shut down at once, as leaving a ``with`` block on Ctrl-C does.  In the
second a hang with a timeout gives ``DispatchTimeoutError`` naming the
method and the rank still running, and the group refuses later calls.
Either way ``shutdown()`` does not wait for the hung rank, and nothing is
left behind (on ``local`` a thread cannot be stopped: the hung rank's
daemon thread ends when its method returns, which the test then lets it do).
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from dispatchcore import DispatchError, DispatchTimeoutError, WorkerGroup

from ._harness import FAULT_TABLE, backend_params, ctrl_c_after, fault_row
from ._leaks import Snapshot, settle, timed
from ._workers import RELEASE, FaultWorker

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(120),
    # The multiprocess example plugin shares torchrun's lane code: the full fault run covers it here.
    pytest.mark.parametrize("backend", backend_params(full=("multiprocess",)), indirect=True),
]

HUNG = 1  # the rank that is slow, then hangs
DEATH_TIMEOUT = 1.0
SLOW_S = 2.5  # well past DEATH_TIMEOUT
CALL_TIMEOUT = 1.0
CTRL_C_AFTER = 1.0


def _leaks_after_hang(backend: str, before: Snapshot) -> tuple[dict[str, Any], str]:
    """Leaks once the group is shut down; on ``local`` the hung thread is let go first (and noted)."""
    note = ""
    if backend == "local":
        if settle(before, within=0.5):
            note = " (the hung rank's daemon thread stays until its method returns)"
        RELEASE.set()
    try:
        leaks = settle(before, ray=backend == "ray")
    finally:
        RELEASE.clear()
    return leaks, ("none" if not leaks else str(leaks)) + note


def test_a_slow_rank_and_a_hang_ended_by_ctrl_c(backend: str, record: Any) -> None:
    table = FAULT_TABLE.format(backend=backend)
    before = Snapshot.take(ray=backend == "ray")
    wg = WorkerGroup(FaultWorker, 2, backend=backend, death_timeout=DEATH_TIMEOUT)
    try:
        # A slow rank is waited for, never taken for a dead one.
        seconds, value = timed(lambda: wg.sleep_on(HUNG, SLOW_S))
        assert value == [0, 1]
        slow = fault_row(f"rank slow ({SLOW_S:g} s)", None, seconds, f"death_timeout {DEATH_TIMEOUT:g}", "yes", "-")
        record(table, **{**slow, "detected as": "result (not a death)"})

        # No call timeout: the call waits (documented) until Ctrl-C.
        with ctrl_c_after(CTRL_C_AFTER) as sent, pytest.raises(KeyboardInterrupt):
            wg.hang(HUNG)
        interrupted = time.monotonic() - sent[0]
    finally:
        stopped = time.monotonic()
        wg.shutdown()  # at once, with rank 1 still in the interrupted call
        shutdown_s = time.monotonic() - stopped
    leaks, leak_text = _leaks_after_hang(backend, before)
    record(
        table,
        **fault_row(
            "rank hangs, no call timeout: Ctrl-C, then shutdown",
            KeyboardInterrupt(),
            interrupted,
            "1 (Ctrl-C)",
            f"yes (the interrupted call runs on); shutdown {shutdown_s:.2f} s",
            leak_text,
            where=f"the wait for rank {HUNG}",
        ),
    )
    assert not leaks


def test_a_hang_past_the_call_timeout(backend: str, record: Any) -> None:
    before = Snapshot.take(ray=backend == "ray")
    wg = WorkerGroup(FaultWorker, 2, backend=backend)
    try:
        seconds, error = timed(lambda: wg.hang.options(timeout=CALL_TIMEOUT)(HUNG))
        assert isinstance(error, DispatchTimeoutError), error
        assert "'hang'" in str(error) and f"rank(s) [{HUNG}]" in str(error)
        with pytest.raises(DispatchError, match="no more calls: call 'hang' outlived its 1 s timeout"):
            wg.ping()
    finally:
        stopped = time.monotonic()
        wg.shutdown()
        shutdown_s = time.monotonic() - stopped
    leaks, leak_text = _leaks_after_hang(backend, before)
    record(
        FAULT_TABLE.format(backend=backend),
        **fault_row(
            f"rank hangs, call timeout {CALL_TIMEOUT:g} s",
            error,
            seconds,
            CALL_TIMEOUT,
            f"no: refuses calls, says the call timed out; shutdown {shutdown_s:.2f} s",
            leak_text,
            where=f"rank(s) [{HUNG}], 'hang' (in the message)",
        ),
    )
    assert not leaks
