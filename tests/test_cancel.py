"""``future.cancel()`` and ``on_timeout="cancel"`` stop a call on every rank of it, on every backend.

Structure, never timing: a call is started, the ranks' stacks are read
until every rank is in the method (pytest-timeout bounds the wait), then it
is cancelled.  The methods would run for ten minutes or for ever, far past
each test's timeout, so a test that passes proves the cancel ended them.
One group per backend serves every case whose ranks leave the call; a rank
blocked in C (on torchrun: with the cancel's signal masked) never does, so those cases build a group of their own: it is
restarted (``on_rank_death="replace"``) or declared broken.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import signal
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from dispatchcore import (
    CallCancelledError,
    Dispatch,
    DispatchError,
    DispatchTimeoutError,
    Worker,
    WorkerGroup,
    available_backends,
    register,
)
from dispatchcore.testing import Fault

pytestmark = [pytest.mark.slow, pytest.mark.timeout(60)]

# The worker class travels by value: Ray's worker processes cannot import this test module.
for _pickler in (pytest.importorskip("cloudpickle"), pytest.importorskip("ray.cloudpickle")):
    _pickler.register_pickle_by_value(sys.modules[__name__])

#: The group's options on each backend: ``faulty`` runs its ranks on ``local`` threads.
OPTIONS: dict[str, dict[str, Any]] = {
    "local": {},
    "mock": {},
    "faulty": {"inner": "local"},
    "multiprocess": {},
    "torchrun": {},
    "ray": {},
}
#: Backends that restart a rank stuck in C; torchrun does so from its spare processes.
RESTARTING: dict[str, dict[str, Any]] = {"multiprocess": {}, "torchrun": {"spare_ranks": 2}, "ray": {}}
#: Backends that cannot: the group is declared broken.
BREAKING = ["local", "mock", "faulty"]
FOREVER = 600.0


def _backend(name: str) -> Any:
    return pytest.param(
        name, marks=pytest.mark.skipif(name not in available_backends(), reason=f"backend {name!r} is not installed")
    )


class Sleeper(Worker):
    """Methods that never end on their own, and a note of what stopped each (per rank)."""

    def __init__(self) -> None:
        self.count = 0
        self.seen: list[str] = []

    @contextlib.contextmanager
    def noting(self) -> Iterator[None]:
        """Note the exception that ends the method (``CallInterrupted``, ``CancelledError``)."""
        try:
            yield
        except BaseException as exc:
            self.seen.append(type(exc).__name__)
            raise

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def bump(self) -> int:
        self.count += 1
        return self.count

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def outcomes(self) -> list[str]:
        """What stopped each method since the last ask."""
        seen, self.seen = self.seen, []
        return seen

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def quick(self) -> int:
        return self.rank

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def nap_forever(self) -> None:
        with self.noting():
            while True:
                time.sleep(0.05)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def doze_forever(self) -> None:
        with self.noting():
            while True:
                time.sleep(0.05)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    async def await_forever(self) -> None:
        with self.noting():
            await asyncio.sleep(FOREVER)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def spin_forever(self) -> None:
        with self.noting():
            while True:
                pass

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def poll_cancelled(self) -> str:
        while not self.cancelled():
            time.sleep(0.01)
        self.seen.append("returned")
        return "returned"

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def sleep_in_c(self) -> None:
        time.sleep(FOREVER)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def sleep_in_c_deaf(self) -> None:
        """Blocked in C with the cancel's signal masked, as C code that blocks signals is: only a restart ends it."""
        from dispatchcore.executor import INTERRUPT_SIGNAL

        masked = signal.pthread_sigmask(signal.SIG_BLOCK, {INTERRUPT_SIGNAL} if INTERRUPT_SIGNAL else set())
        try:
            time.sleep(FOREVER)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, masked)


def _group(request: pytest.FixtureRequest, backend: str, **options: Any) -> WorkerGroup[Any]:
    if backend == "ray":
        request.getfixturevalue("ray_session")  # the session's one local Ray, never a new one
    return WorkerGroup(Sleeper, 2, backend=backend, **OPTIONS[backend], **options)


@pytest.fixture(scope="module", params=[_backend(name) for name in OPTIONS])
def group(request: pytest.FixtureRequest) -> Iterator[WorkerGroup[Any]]:
    with _group(request, request.param) as wg:
        yield wg


def _wait_until_in(wg: WorkerGroup[Any], function: str) -> None:
    """Read the stacks until every rank (``mock``: its one thread) is in ``function``."""
    while True:
        stacks = wg.rank_stacks()
        if len(stacks) == wg.world_size and all(f"in {function}" in text for text in stacks.values()):
            return
        time.sleep(0.05)


def _every_rank_saw(wg: WorkerGroup[Any], outcome: str) -> list[list[str]]:
    """What each rank notes once ``outcome`` stopped the call there (``mock`` runs rank 1 after rank 0: it skips)."""
    if wg.backend == "mock":
        return [[outcome], []]
    return [[outcome]] * wg.world_size


@pytest.mark.parametrize(
    "method, running_in, outcome",
    [
        ("nap_forever", "nap_forever", "CallInterrupted"),
        ("await_forever", "run_until_complete", "CancelledError"),
        ("spin_forever", "spin_forever", "CallInterrupted"),
        ("poll_cancelled", "poll_cancelled", "returned"),
    ],
)
def test_a_cancel_stops_the_call_on_every_rank_and_the_group_goes_on(
    group: WorkerGroup[Any], method: str, running_in: str, outcome: str
) -> None:
    before = group.bump()
    future = getattr(group, method)()
    _wait_until_in(group, running_in)
    assert future.cancel() is True
    assert future.cancel() is True and future.cancelled()  # asking again changes nothing
    with pytest.raises(CallCancelledError, match=f"{method!r} was cancelled") as info:
        future.get()
    assert isinstance(info.value, concurrent.futures.CancelledError)
    assert info.value.method == method
    # The next call waits for the ranks to leave the cancelled one, then runs on the same workers.
    assert group.outcomes() == _every_rank_saw(group, outcome)
    assert group.bump() == [n + 1 for n in before]


def test_a_finished_call_cannot_be_cancelled(group: WorkerGroup[Any]) -> None:
    future = group.quick()
    while not future.done():
        time.sleep(0.01)
    assert future.cancel() is False
    assert not future.cancelled()
    assert future.get() == [0, 1]
    assert future.cancel() is False  # nor once its value was read


def test_on_timeout_cancel_stops_the_call_and_keeps_the_group(group: WorkerGroup[Any]) -> None:
    before = group.bump()
    timed_out = r"'doze_forever' did not finish within 0.5 s; still waiting on rank\(s\) \[0, 1\]"
    with pytest.raises(DispatchTimeoutError, match=timed_out) as info:
        group.doze_forever.options(timeout=0.5, on_timeout="cancel")()
    assert any("the call was cancelled on its ranks" in note for note in getattr(info.value, "__notes__", []))
    assert group.executor.broken is None
    assert group.outcomes() == _every_rank_saw(group, "CallInterrupted")
    assert group.bump() == [n + 1 for n in before]


def _cancel_a_call_blocked_in_c(wg: WorkerGroup[Any], method: str = "sleep_in_c") -> None:
    future = getattr(wg, method)()
    _wait_until_in(wg, method)
    assert future.cancel() is True
    with pytest.raises(CallCancelledError):
        future.get()


def _assert_broken_by_stuck_ranks(wg: WorkerGroup[Any]) -> None:
    """The next call names the stuck ranks and where they are; every later one is refused too."""
    with pytest.raises(DispatchError, match=r"can take no more calls: rank\(s\) \[0, 1\] are still running") as info:
        wg.bump()
    assert info.value.ranks == (0, 1)  # type: ignore[attr-defined]
    assert "in sleep_in_c" in "\n".join(getattr(info.value, "__notes__", []))
    with pytest.raises(DispatchError, match="can take no more calls"):
        wg.bump()


@pytest.mark.parametrize("backend", [_backend(name) for name in RESTARTING])
def test_ranks_blocked_in_c_are_restarted_before_the_next_call(request: pytest.FixtureRequest, backend: str) -> None:
    # torchrun's signal ends a plain sleep (tests/test_cancel_blocked_in_c.py): its ranks mask it here
    method = "sleep_in_c_deaf" if backend == "torchrun" else "sleep_in_c"
    with _group(request, backend, on_rank_death="replace", cancel_grace=1.0, **RESTARTING[backend]) as wg:
        assert wg.bump() == [1, 1]
        _cancel_a_call_blocked_in_c(wg, method)
        assert wg.bump() == [1, 1]  # new workers: the stuck ones were restarted
        assert wg.bump() == [2, 2]
        if backend == "torchrun":  # both spares are spent: without one, torchrun cannot restart a rank
            _cancel_a_call_blocked_in_c(wg, method)
            _assert_broken_by_stuck_ranks(wg)


@pytest.mark.parametrize("backend", [_backend(name) for name in BREAKING])
def test_ranks_blocked_in_c_break_a_group_that_cannot_restart_them(
    request: pytest.FixtureRequest, backend: str
) -> None:
    wg = _group(request, backend, cancel_grace=1.0)
    try:
        _cancel_a_call_blocked_in_c(wg)
        _assert_broken_by_stuck_ranks(wg)
    finally:
        wg.shutdown()  # returns at once although the ranks' threads still sleep (the test's timeout bounds it)


def test_a_rank_a_fault_hung_is_replaced_after_a_cancel(request: pytest.FixtureRequest) -> None:
    """``faulty`` over ``local``: the hung rank never leaves the call, and replacing it is faked."""
    faults = [Fault.hang(rank=1, method="nap_forever")]
    with _group(request, "faulty", on_rank_death="replace", cancel_grace=1.0, faults=faults) as wg:
        assert wg.bump() == [1, 1]
        future = wg.nap_forever()
        assert future.cancel() is True
        with pytest.raises(CallCancelledError):
            future.get()
        assert wg.bump() == [2, 2]  # rank 1 "restarted": its worker kept, as the fault killed nothing
