"""RankCallHandle: the one place every executor's time bounds live."""

from __future__ import annotations

import threading
import time

import pytest

from dispatchcore import DispatchTimeoutError, WorkerDiedError, WorkerError
from dispatchcore.executor import Call, RankCallHandle, RemoteFailure, liveness_poll

#: The shortest slice a handle waits near the gather's end (its MIN_GATHER_SLICE_S).
SHORTEST_SLICE_S = 0.002

pytestmark = pytest.mark.timeout(30)


def call(ranks: tuple[int, ...] = (0, 1, 2), timeout: float | None = None) -> Call:
    return Call("step", ranks, [()] * len(ranks), [{}] * len(ranks), timeout)


class Broken:
    def __init__(self) -> None:
        self.reasons: list[str] = []

    def __call__(self, reason: str) -> None:
        self.reasons.append(reason)


def later(seconds: float, fn, *args) -> None:  # type: ignore[no-untyped-def]
    timer = threading.Timer(seconds, fn, args)
    timer.daemon = True
    timer.start()


def test_results_in_call_order() -> None:
    handle = RankCallHandle(call(), death_timeout=5)
    for position in (2, 0, 1):
        handle.deliver(position, True, position * 10)
    assert handle.done() and handle.result() == [0, 10, 20]


def test_lowest_failure_wins_and_others_are_noted() -> None:
    handle = RankCallHandle(call(), death_timeout=5)
    handle.deliver(0, True, None)
    for position in (2, 1):
        handle.deliver(position, False, RemoteFailure(-1, "step", "ValueError", f"bad {position}", "tb"))
    with pytest.raises(WorkerError) as info:
        handle.result()
    assert info.value.rank == 1 and "bad 1" in str(info.value)
    assert any("[2]" in note for note in info.value.__notes__)


def test_a_short_wait_times_out_but_leaves_the_group_usable() -> None:
    broken = Broken()
    handle = RankCallHandle(call(), death_timeout=5, on_broken=broken)
    with pytest.raises(DispatchTimeoutError, match=r"rank\(s\) \[0, 1, 2\]"):
        handle.result(0.05)
    assert broken.reasons == []
    for position in range(3):
        handle.deliver(position, True, position)
    assert handle.result(1) == [0, 1, 2]


def test_the_calls_own_bound_breaks_the_group() -> None:
    broken = Broken()
    handle = RankCallHandle(call(timeout=0.1), death_timeout=5, on_broken=broken)
    handle.deliver(0, True, 0)
    with pytest.raises(DispatchTimeoutError, match=r"rank\(s\) \[1, 2\]"):
        handle.result()
    assert len(broken.reasons) == 1 and "0.1 s timeout" in broken.reasons[0]


def test_a_death_ends_the_call_at_once_while_others_still_run() -> None:
    broken = Broken()
    handle = RankCallHandle(call(), death_timeout=5, on_broken=broken)
    handle.deliver(0, True, 0)
    later(0.1, handle.rank_died, 1, "process exited with code -9")
    # Rank 2 never answers: a WorkerDiedError (not the wait's DispatchTimeoutError)
    # shows the death ended the call before the 20 s wait did.
    with pytest.raises(WorkerDiedError) as info:
        handle.result(20)
    assert info.value.rank == 1 and "-9" in str(info.value) and broken.reasons == ["rank 1 died"]


def test_liveness_checks_run_while_waiting() -> None:
    class Dying(RankCallHandle):
        checks = 0

        def check_alive(self, waiting: list[int]) -> None:
            self.checks += 1
            if self.checks == 3:
                self.rank_died(waiting[0], "its thread is no longer running")

    handle = Dying(call((4, 5)), death_timeout=0.2)
    assert handle.poll == liveness_poll(0.2) == 0.05
    with pytest.raises(WorkerDiedError) as info:
        handle.result()
    assert info.value.rank == 4 and handle.checks == 3


def test_a_pull_backend_waits_no_longer_than_the_gather_after_a_raise() -> None:
    """A pull backend's wait cannot see the gather's timer: the handle's slices end with the gather.

    Each slice is checked against the moment the previous wait returned (the handle sizes the next
    slice after that), so a loaded machine cannot make the check pass or fail by timing; past the
    gather's end (its timer may fire a moment late) a slice is the shortest one.
    """

    class Pull(RankCallHandle):
        def __init__(self) -> None:
            super().__init__(call(), death_timeout=60)  # poll 0.5 s: far past the gather
            self.slices: list[tuple[float, float]] = []  # (when the previous wait returned, seconds asked)
            self.returned = time.monotonic()

        def wait_for_progress(self, seconds: float) -> None:
            self.slices.append((self.returned, seconds))
            if len(self.slices) == 1:  # rank 1's failure lands; ranks 0 and 2 never answer
                self.deliver(1, False, RemoteFailure(-1, "step", "ValueError", "bad", "tb"))
            else:
                time.sleep(seconds)  # blind to the timer, as a ray.wait on the others is
            self.returned = time.monotonic()

    handle = Pull()
    assert handle.gather_deadline is None
    with pytest.raises(WorkerError) as info:
        handle.result()
    gather = handle.gather_deadline
    assert info.value.rank == 1 and gather is not None
    late = [
        (start, seconds)
        for start, seconds in handle.slices[1:]
        if start + seconds > max(start, gather) + SHORTEST_SLICE_S
    ]
    assert len(handle.slices) >= 2 and not late, (handle.slices, gather)


def test_no_ranks_is_done_at_once() -> None:
    assert RankCallHandle(call(()), death_timeout=1).result() == []


def test_timeout_error_carries_method_and_ranks_through_pickle() -> None:
    import pickle

    from dispatchcore.executor import timeout_error

    error = pickle.loads(pickle.dumps(timeout_error("step", 1.0, [1, 3])))
    assert error.method == "step" and error.ranks == (1, 3)
    assert "rank(s) [1, 3]" in str(error)
