"""The opt-in compiled path (``compiled=True``): same results as plain calls, torn down when idle or shut down.

One compiled group per module (compiling costs about a second, and each
actor spins a core while its graph lives); the plain group it is compared
with is built beside it.
"""

from __future__ import annotations

import sys
import time

import pytest

pytest.importorskip("ray")

import torch  # noqa: E402

from dispatchcore import DataProto, Dispatch, Worker, WorkerError, WorkerGroup, register  # noqa: E402
from executors_ray.testing import ray_session  # noqa: E402, F401

pytestmark = [
    pytest.mark.usefixtures("ray_session"),
    pytest.mark.timeout(120),
    pytest.mark.filterwarnings("ignore:compiled=True is deprecated:FutureWarning"),  # retired for one release
]

# The worker class below travels by value: Ray's worker processes cannot import this test module.
for _pickler in (pytest.importorskip("cloudpickle"), pytest.importorskip("ray.cloudpickle")):
    _pickler.register_pickle_by_value(sys.modules[__name__])


class Stepper(Worker):
    """A fixed loop's methods: a control call, a DP step, a raising one, one that mutates its input."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def noop(self) -> None:
        return None

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def whoami(self, tag: str) -> tuple[int, str]:
        return self.rank, tag

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def later(self, tag: str) -> tuple[int, str]:
        return self.rank, tag

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def scale(self, data: DataProto) -> DataProto:
        ids = data.batch["input_ids"]
        ids.mul_(2)  # writes its input in place: isolation must keep the driver's copy intact
        return DataProto.from_dict({"input_ids": ids + self.rank}, meta_info={"pad": data.meta_info.get("_pad_size")})

    @register(dispatch_mode=Dispatch.DP_COMPUTE_METRIC)
    def rows(self, data: DataProto) -> int:
        return len(data)

    @register(dispatch_mode=Dispatch.RANK_ZERO)
    def first(self, x: int) -> int:
        return x + 1

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def boom(self) -> None:
        raise ValueError(f"boom on rank {self.rank}")


@pytest.fixture(scope="module")
def groups(ray_session):  # noqa: F811
    fast = WorkerGroup(Stepper, 2, backend="ray", compiled=True, compiled_idle_s=1.0, name="compiled-2")
    plain = WorkerGroup(Stepper, 2, backend="ray", name="plain-2")
    yield fast, plain
    fast.shutdown()
    plain.shutdown()


def _graph(wg: WorkerGroup) -> object:
    return wg.executor.compiled  # type: ignore[attr-defined]


def _batch(rows: int) -> DataProto:
    return DataProto.from_dict({"input_ids": torch.arange(rows * 3).reshape(rows, 3)}, auto_padding=True)


def test_same_results_as_plain_calls(groups: tuple[WorkerGroup, WorkerGroup]) -> None:
    fast, plain = groups
    assert fast.noop() == plain.noop() == [None, None]
    assert fast.whoami("x") == plain.whoami("x") == [(0, "x"), (1, "x")]
    assert fast.first(41) == plain.first(41) == 42
    for rows in (4, 5):  # 5 rows: padded to 6, one padding row visible to rank 1, trimmed after
        batch = _batch(rows)
        before = batch.batch["input_ids"].clone()
        got, want = fast.scale(batch), plain.scale(batch)
        assert torch.equal(got.batch["input_ids"], want.batch["input_ids"])
        assert len(got) == rows
        assert torch.equal(batch.batch["input_ids"], before)  # isolation: the driver's batch untouched
        assert fast.rows(batch) == plain.rows(batch)
    assert _graph(fast).live  # type: ignore[attr-defined]
    assert _graph(fast).compiles >= 1  # type: ignore[attr-defined]


def test_raising_worker_gives_the_same_worker_error(groups: tuple[WorkerGroup, WorkerGroup]) -> None:
    fast, plain = groups
    errors = []
    for wg in (fast, plain):
        with pytest.raises(WorkerError) as info:
            wg.boom()
        errors.append(info.value)
    got, want = errors
    assert (got.rank, got.method) == (want.rank, want.method) == (0, "boom")
    assert str(got).splitlines()[0] == str(want).splitlines()[0]
    assert "boom on rank 0" in got.remote_traceback
    assert fast.whoami("after") == [(0, "after"), (1, "after")]  # the group (and its graph) still serve


def test_nonblocking_calls_resolve_in_order(groups: tuple[WorkerGroup, WorkerGroup]) -> None:
    fast, _ = groups
    futures = [fast.later(str(i)) for i in range(5)]
    assert [f.get() for f in futures] == [[(0, str(i)), (1, str(i))] for i in range(5)]


def test_idle_graph_is_torn_down_and_rebuilt(groups: tuple[WorkerGroup, WorkerGroup]) -> None:
    fast, _ = groups
    graph = _graph(fast)
    fast.noop()
    compiles = graph.compiles  # type: ignore[attr-defined]
    deadline = time.monotonic() + 60  # compiled_idle_s=1: torn down long before this (a bound, not a figure)
    while not graph.teardowns and time.monotonic() < deadline:  # type: ignore[attr-defined]
        time.sleep(0.1)
    assert not graph.live  # type: ignore[attr-defined]
    assert graph.teardowns[-1].startswith("idle")  # type: ignore[attr-defined]
    assert fast.whoami("again") == [(0, "again"), (1, "again")]
    assert graph.compiles == compiles + 1  # type: ignore[attr-defined]


def test_call_the_graph_cannot_carry_runs_plain(groups: tuple[WorkerGroup, WorkerGroup], ray_session) -> None:  # noqa: F811
    fast, plain = groups
    fast.noop()
    ref = ray_session.put("by reference")  # object references go as plain Ray tasks, whatever those do with them
    assert fast.whoami(ref) == plain.whoami(ref)
    assert not _graph(fast).live  # type: ignore[attr-defined]
    assert fast.whoami("x") == [(0, "x"), (1, "x")]  # compiled again


def test_shutdown_releases_graph_and_actors(ray_session) -> None:  # noqa: F811
    wg = WorkerGroup(Stepper, 2, backend="ray", compiled=True, name="compiled-shutdown")
    actors = wg.executor.actors  # type: ignore[attr-defined]
    assert wg.noop() == [None, None]
    graph = _graph(wg)
    assert graph.live  # type: ignore[attr-defined]
    wg.shutdown()
    assert not graph.live  # type: ignore[attr-defined]
    assert "shutdown" in graph.teardowns  # type: ignore[attr-defined]
    for actor in actors:
        # ray.kill is asynchronous: a ping sent right after it may still be answered. The actor must
        # stop answering soon after; the test's timeout bounds "soon".
        while True:
            try:
                ray_session.get(actor.ping.remote(), timeout=60)
            except ray_session.exceptions.RayActorError:
                break
            time.sleep(0.05)
    wg.shutdown()  # idempotent


def test_bad_options_are_refused(ray_session) -> None:  # noqa: F811
    with pytest.raises(TypeError, match="compiled must be True or False"):
        WorkerGroup(Stepper, 1, backend="ray", compiled="yes")
    with pytest.raises(ValueError, match="compiled_idle_s"):
        WorkerGroup(Stepper, 1, backend="ray", compiled=True, compiled_idle_s=0)


@pytest.mark.filterwarnings("default:compiled=True is deprecated:FutureWarning")
def test_compiled_true_is_deprecated_and_says_why_at_the_callers_line() -> None:
    with pytest.warns(FutureWarning, match="control lane") as caught:
        group = WorkerGroup(Stepper, 1, backend="ray", compiled=True, name="compiled-deprecated")
    group.shutdown()
    assert caught[0].filename == __file__  # the warning names the user's line, not the library's
