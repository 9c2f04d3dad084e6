"""A call ends without waiting for ranks stuck in a collective; the group recovers the documented way.

Two faults, each with a rank left blocked in C code that no interrupt
reaches (a gloo ``all_reduce`` with a 600 s timeout, ``time.sleep(600)``, a
barrier without a timeout), so a test passes only if the driver stops
waiting for that rank by itself, far sooner than the rank would:

* **fail fast**: rank 1 raises ``ValueError`` just before the collective
  rank 0 is already in.  The driver gets ``WorkerError`` naming rank 1, the
  method and the ValueError (with rank 0's stack in its notes).  Then,
  where ranks can be restarted (self-started torchrun with a spare, Ray,
  multiprocess), the next call either refuses naming rank 0 as stuck, after
  which ``wg.replace_rank(0)`` brings the group back (setup replayed, the
  gloo world rebuilt in ``on_membership_change``), or, with
  ``on_rank_death="replace"``, simply answers.  Local threads cannot be
  restarted: the next call says the group can take no more calls, naming
  rank 0, and ``shutdown()`` returns at once.
* **death mid-call**: rank 1 is SIGKILLed while rank 0 is in a long call
  (``time.sleep(600)``) or in a gloo collective with it.  ``wg.replace_rank(1)``
  after the ``WorkerDiedError``, or ``on_rank_death="replace"``, restarts it
  (and rank 0 too if it is still stuck after ``cancel_grace``) and the
  group answers, collective included.

Every group is fresh (the faults replace ranks); times go to RELIABILITY.md
(``faults/<backend>``), measured, never asserted.
"""

from __future__ import annotations

import os
import re
import signal
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dispatchcore import DispatchError, WorkerDiedError, WorkerError, WorkerGroup

from ._collective_workers import GLOO_TIMEOUT_S, CollectiveWorker, release_barriers
from ._harness import DEATH_TIMEOUT, FAULT_TABLE, PROCESS_BACKENDS, DeathWatch, backend_params, fault_row, full_only
from ._leaks import Snapshot, settle, timed

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]  # the stuck rank would wait 600 s

#: How long stuck ranks get to leave an ended call: short, so the tests wait little for them.
CANCEL_GRACE = 1.0
#: The sum of ``rank + 1`` over two ranks: what a working collective answers.
TOTAL = [3.0, 3.0]
#: ``shutdown()`` returns within this, stuck or replaced ranks or not.  The one timing asserted:
#: torchrun's stop waited its whole 10 s bound for a killed rank's answer (fixed by ``Hub.retire``).
PROMPT_S = 5.0


def _group(backend: str, policy: str, spares: int = 1) -> WorkerGroup[CollectiveWorker]:
    """Two ranks in a collective; ``policy`` is ``on_rank_death``; torchrun gets ``spares`` spare processes."""
    options: dict[str, Any] = {"death_timeout": DEATH_TIMEOUT, "cancel_grace": CANCEL_GRACE, "on_rank_death": policy}
    if backend == "torchrun":
        options["spare_ranks"] = spares
    wg = WorkerGroup(CollectiveWorker, 2, backend=backend, **options)
    try:
        wg.join("thread" if backend == "local" else "gloo", f"fail-fast-{uuid.uuid4().hex}")
        assert wg.total() == TOTAL
    except BaseException:
        wg.shutdown()
        raise
    return wg


def _shut(wg: WorkerGroup[Any]) -> float:
    seconds, _ = timed(wg.shutdown)
    release_barriers()  # a local rank stuck at its barrier leaves it (its thread ends)
    return seconds


# -- fail fast ---------------------------------------------------------------------------
#: (backend, route): local groups end broken; the others come back by hand or by policy.
#: CI runs each route on one process backend, and each of Ray and torchrun once (the multiprocess
#: example plugin shares torchrun's lane code); the full fault run, every pair.
CI_FAIL_FAST = {("ray", "policy"), ("torchrun", "replace_rank")}
FAIL_FAST = [
    *[pytest.param(p.values[0], "broken", id="local", marks=p.marks) for p in backend_params(("local",))],
    *[
        pytest.param(
            p.values[0],
            route,
            id=f"{p.values[0]}-{route}",
            marks=[*p.marks, *(() if (p.values[0], route) in CI_FAIL_FAST else (full_only,))],
        )
        for p in backend_params(PROCESS_BACKENDS)
        for route in ("replace_rank", "policy")
    ],
]


def _check_fail_fast(error: Any, backend: str) -> float:
    """``error`` names rank 1, the method and the ValueError, and says where rank 0 is; seconds since the raise."""
    now = time.monotonic()
    assert isinstance(error, WorkerError), error
    assert (error.rank, error.method, error.exc_type) == (1, "raise_before_total", "ValueError")
    assert "ValueError" in str(error) and "planted before the collective on rank 1" in str(error)
    notes = "\n".join(getattr(error, "__notes__", []))
    assert "rank(s) [0] had not finished 'raise_before_total'" in notes
    assert ("all_reduce" if backend != "local" else "barrier.wait") in notes  # rank 0 was in the collective
    raised_at = float(re.search(r"at t=([0-9.]+)", str(error)).group(1))  # type: ignore[union-attr]
    return now - raised_at


def _route_after_fail_fast(wg: WorkerGroup[CollectiveWorker], route: str) -> str:
    """Take the documented way back (or to the end, on local); what happened, with its times."""
    if route == "policy":
        seconds, answer = timed(wg.total)  # rank 0 restarted after cancel_grace, then the call runs
        assert answer == TOTAL, answer
        stuck = f"rank 0 restarted, stuck past cancel_grace {CANCEL_GRACE:g}"
        return f"yes: the next call answered in {seconds:.2f} s ({stuck})"
    seconds, refused = timed(wg.total)
    assert isinstance(refused, DispatchError), refused
    assert refused.ranks == (0,) and "still running 'raise_before_total'" in str(refused)  # type: ignore[attr-defined]
    if route == "broken":
        assert "can take no more calls" in str(refused) and "cannot restart ranks" in str(refused)
        return f"no: the next call refused after {seconds:.2f} s naming rank 0 (stuck); local threads cannot restart"
    assert "wg.replace_rank(0)" in str(refused)
    replaced, change = timed(lambda: wg.replace_rank(*refused.ranks))  # type: ignore[attr-defined]
    assert not isinstance(change, BaseException), repr(change)
    assert change.replaced == (0,), change
    assert wg.total() == TOTAL  # the rebuilt gloo world all-reduces again
    return (
        f"yes, after wg.replace_rank(0): the next call refused after {seconds:.2f} s naming rank 0 (stuck), "
        f"replace_rank took {replaced:.2f} s, then the collective ran"
    )


@pytest.mark.parametrize(("backend", "route"), FAIL_FAST, indirect=["backend"])
def test_a_raise_before_a_collective_ends_the_call_without_the_stuck_rank(
    backend: str, route: str, record: Any, tmp_path: Path
) -> None:
    ray = backend == "ray"
    before = Snapshot.take(ray=ray)
    wg = _group(backend, "replace" if route == "policy" else "raise")
    try:
        _, error = timed(lambda: wg.raise_before_total(1, str(tmp_path / "rank0-in-collective")))
        detected = _check_fail_fast(error, backend)
        usable = _route_after_fail_fast(wg, route)
    finally:
        shutdown = _shut(wg)
    assert shutdown < PROMPT_S, shutdown
    leaks = settle(before, ray=ray)
    bound = f"{GLOO_TIMEOUT_S:g} (gloo timeout)" if backend != "local" else "none (barrier without timeout)"
    what = "gloo all_reduce" if backend != "local" else "barrier"
    record(
        FAULT_TABLE.format(backend=backend),
        **fault_row(
            f"rank raises ValueError while rank 0 waits in a {what} ({route}; fail fast)",
            error,
            detected,
            bound,
            f"{usable}; shutdown {shutdown:.2f} s",
            leaks,
        ),
    )
    assert not leaks


# -- death mid-call ----------------------------------------------------------------------
#: Where rank 0 is when rank 1 is killed: the call, its method, what rank 0's stack shows then, in words.
WHERE: dict[str, tuple[Callable[[Any], Any], str, str, str]] = {
    "long call": (lambda wg: wg.sleep_long(600.0), "sleep_long", "in sleep_long", "time.sleep(600)"),
    "collective": (lambda wg: wg.total_after(1, 600.0), "total_after", "all_reduce", "a gloo all_reduce"),
}

#: CI covers each place and each route once, on Ray and on torchrun; the full run, every backend and pair.
CI_DEATHS = {("torchrun", "long call", "replace_rank"), ("ray", "collective", "policy")}
DEATHS = [
    pytest.param(
        b.values[0],
        where,
        route,
        id=f"{where.replace(' ', '-')}-{route}-{b.values[0]}",
        marks=[*b.marks, *(() if (b.values[0], where, route) in CI_DEATHS else (full_only,))],
    )
    for where, route in [
        ("long call", "replace_rank"),
        ("collective", "policy"),
        ("long call", "policy"),
        ("collective", "replace_rank"),
    ]
    for b in backend_params(PROCESS_BACKENDS)
]


def _kill_when_in(wg: WorkerGroup[Any], pid: int, marker: str) -> threading.Thread:
    """SIGKILL rank 1 (``pid``) once rank 0's stack shows ``marker`` (its call is under way)."""

    def watch() -> None:
        deadline = time.monotonic() + 30.0
        try:
            while time.monotonic() < deadline and marker not in wg.rank_stacks(timeout=2.0).get(0, ""):
                time.sleep(0.05)
        finally:  # killed in any case: the call must not wait out its 600 s
            os.kill(pid, signal.SIGKILL)

    thread = threading.Thread(target=watch, name="kill-rank-1", daemon=True)
    thread.start()
    return thread


def _replace_after_death(wg: WorkerGroup[CollectiveWorker], error: Any, route: str) -> str:
    """After the death: replace rank 1 by hand, or check the policy did before raising; who did it, in words."""
    if route == "policy":
        notes = "\n".join(getattr(error, "__notes__", []))
        assert "rank 1 was replaced (on_rank_death='replace')" in notes, notes
        return "on_rank_death='replace' (before raising: in the time to detect)"
    seconds, change = timed(lambda: wg.replace_rank(1))
    assert not isinstance(change, BaseException), change
    assert 1 in change.replaced
    return f"wg.replace_rank(1) ({seconds:.2f} s)"


@pytest.mark.parametrize(("backend", "where", "route"), DEATHS, indirect=["backend"])
def test_a_rank_killed_mid_call_is_replaced_and_the_group_answers(
    backend: str, where: str, route: str, record: Any
) -> None:
    ray = backend == "ray"
    plant, method, marker, doing = WHERE[where]
    if where == "long call" and backend == "torchrun":  # unmasked, torchrun's signal ends the sleep (no restart)
        doing += ", the cancel's signal masked"
    before = Snapshot.take(ray=ray)
    # On torchrun each replaced rank takes a spare: rank 0 too when it is stuck in its sleep.
    wg = _group(backend, "replace" if route == "policy" else "raise", spares=2 if where == "long call" else 1)
    try:
        pids = wg.pid()
        watch = DeathWatch(pids[1])
        killer = _kill_when_in(wg, pids[1], marker)
        _, error = timed(lambda: plant(wg))
        ended = time.monotonic()
        detected = max(0.0, ended - watch.wait())  # the 2 ms watch may see the death after the driver did
        killer.join()
        assert isinstance(error, WorkerDiedError), error
        assert (error.rank, error.method) == (1, method)
        by = _replace_after_death(wg, error, route)
        answered, answer = timed(wg.total)
        assert answer == TOTAL, answer  # every rank answers, through a rebuilt gloo world
        after = wg.pid()
        restarted = [r for r in (0, 1) if after[r] != pids[r]]
        assert 1 in restarted
        if where == "long call":  # time.sleep is C: rank 0 cannot leave it, so it was restarted too
            assert restarted == [0, 1]
    finally:
        shutdown = _shut(wg)
    assert shutdown < PROMPT_S, shutdown
    leaks = settle(before, ray=ray)
    record(
        FAULT_TABLE.format(backend=backend),
        **fault_row(
            f"rank SIGKILLed while rank 0 is in {doing} ({route})",
            error,
            detected,
            DEATH_TIMEOUT,
            f"yes: rank(s) {restarted} restarted by {by}; the collective then answered in {answered:.2f} s; "
            f"shutdown {shutdown:.2f} s",
            leaks,
        ),
    )
    assert not leaks
