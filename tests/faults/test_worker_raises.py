"""A worker method raises: ``WorkerError`` naming rank and method, and the group stays usable.

Every backend, on the run's shared group (a raise must never break it):
the same workers answer the next call, their state intact.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from dispatchcore import WorkerError

from ._harness import FAULT_TABLE, backend_params, fault_row
from ._leaks import Snapshot, settle, timed

pytestmark = [pytest.mark.timeout(120), pytest.mark.parametrize("backend", backend_params(), indirect=True)]

CASES: dict[str, tuple[str, Callable[[Any], Any], int, list[int]]] = {
    # fault: (method, the planted call, rank reported, ranks that raised)
    "raises on the first call of a method, one rank": ("raise_on", lambda wg: wg.raise_on(1), 1, [1]),
    "raises on one rank": ("raise_on", lambda wg: wg.raise_on([0]), 0, [0]),
    "raises on every rank": ("raise_on", lambda wg: wg.raise_on(None), 0, [0, 1]),
}


def _check_usable(wg: Any, calls: int) -> None:
    """The same workers answer, in rank order, with their state kept (``calls`` counted before)."""
    assert wg.ping() == [0, 1]
    assert wg.counter() == [calls + 1] * 2


@pytest.mark.parametrize("fault", list(CASES))
def test_a_raise_names_rank_and_method_and_leaves_the_group_usable(
    shared_group: Any, backend: str, fault: str, record: Any
) -> None:
    wg = shared_group
    method, plant, rank, raised = CASES[fault]
    (calls, _) = wg.counter()
    before = Snapshot.take(ray=backend == "ray")
    seconds, error = timed(lambda: plant(wg))
    assert isinstance(error, WorkerError), error
    assert (error.rank, error.method) == (rank, method)
    assert "PlantedError" in str(error) and f"planted failure on rank {rank}" in str(error)
    assert f"rank {rank}" in str(error) and repr(method) in str(error)
    assert "PlantedError" in error.remote_traceback
    others = sorted(set(raised) - {rank})
    if others:
        assert any(f"rank(s) {others} raised too" in note for note in getattr(error, "__notes__", []))
    _check_usable(wg, calls + 1)
    leaks = settle(before, ray=backend == "ray")
    record(
        FAULT_TABLE.format(backend=backend),
        **fault_row(f"worker {fault}", error, seconds, "-", "yes (same workers)", leaks),
    )
    assert not leaks


def test_a_raise_on_a_later_call(shared_group: Any, backend: str, record: Any) -> None:
    wg = shared_group
    (calls, _) = wg.counter()
    limit = calls + 2  # two more calls answer, the third raises (on every rank)
    assert wg.raise_after(limit) == [limit - 1] * 2
    assert wg.raise_after(limit) == [limit] * 2
    before = Snapshot.take(ray=backend == "ray")
    seconds, error = timed(lambda: wg.raise_after(limit))
    assert isinstance(error, WorkerError) and (error.rank, error.method) == (0, "raise_after")
    assert f"planted failure on call {limit + 1} of rank 0" in str(error)
    _check_usable(wg, limit + 1)
    leaks = settle(before, ray=backend == "ray")
    record(
        FAULT_TABLE.format(backend=backend),
        **fault_row("worker raises on a later call", error, seconds, "-", "yes (same workers)", leaks),
    )
    assert not leaks
