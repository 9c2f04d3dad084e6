"""Sub-group views on the local executor: selection errors, nesting, lifetime, independence.

What every backend must do with views is in the conformance suite
(``ExecutorConformance.test_view_*``); these are the core's own details.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from dispatchcore import Dispatch, DispatchError, Worker, WorkerGroup, register, trace
from dispatchcore.testing.conformance import batch
from dispatchcore.testing.workers import EchoWorker

#: Released by the test; ranks waiting on it hold their thread (local backend: shared memory).
_gate = threading.Event()


class GatedWorker(Worker):
    @register(Dispatch.ONE_TO_ALL, blocking=False)
    def wait_for_gate(self) -> int:
        _gate.wait(timeout=120)  # far past the test's timeout: only an independent view lets it pass
        return self.rank

    @register(Dispatch.ONE_TO_ALL)
    def rank_of(self) -> int:
        return self.rank


@pytest.fixture(scope="module")
def wg() -> Iterator[WorkerGroup[EchoWorker]]:
    group = WorkerGroup(EchoWorker, 4, backend="local")
    group.set_mesh(2)
    yield group
    group.shutdown()


@pytest.mark.parametrize(
    "select, error, match",
    [
        (lambda g: g[4], IndexError, r"rank 4 is out of range for a group of 4 ranks \(0\.\.3\)"),
        (lambda g: g[-5], IndexError, "out of range"),
        (lambda g: g[3:3], ValueError, "selects no rank"),
        (lambda g: g[10:], ValueError, "selects no rank"),
        (lambda g: g["0"], TypeError, r"rank number or a slice .* wg\.ranks"),
        (lambda g: g[1.0], TypeError, "rank number or a slice"),
        (lambda g: g[True], TypeError, "rank number or a slice"),
        (lambda g: g.ranks([]), ValueError, "selects no rank"),
        (lambda g: g.ranks([0, 4]), IndexError, r"rank\(s\) \[4\] out of range"),
        (lambda g: g.ranks([-1]), IndexError, "out of range"),
        (lambda g: g.ranks([1, 2, 1]), ValueError, r"rank\(s\) \[1\] named more than once"),
        (lambda g: g.ranks([0, "1"]), TypeError, "must be ints"),
        (lambda g: g.ranks([False]), TypeError, "must be ints"),
        (lambda g: g.ranks(3), TypeError, r"list of rank numbers, e\.g\. wg\.ranks\(\[0, 3\]\)"),
        (lambda g: g.ranks("01"), TypeError, "list of rank numbers"),
    ],
)
def test_bad_selections_say_what_is_wrong(wg: WorkerGroup[Any], select: Any, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        select(wg)


def test_selections_that_are_fine(wg: WorkerGroup[Any]) -> None:
    import numpy as np

    assert wg[0].rank_ids == (0,) and wg[-1].rank_ids == (3,)
    assert wg[::-1].rank_ids == (3, 2, 1, 0)
    assert wg.ranks(np.array([2, 0])).rank_ids == (2, 0)
    assert wg.ranks(range(1, 3)).rank_ids == (1, 2)
    assert wg.rank_ids == (0, 1, 2, 3)


def test_views_of_views_number_ranks_within_the_view(wg: WorkerGroup[Any]) -> None:
    inner = wg[1:][1:]
    assert inner.rank_ids == (2, 3) and inner.world_size == 2
    assert wg.ranks([3, 1, 0]).ranks([1]).rank_ids == (1,)
    with pytest.raises(IndexError, match="group of 2 ranks"):
        inner.ranks([2])
    assert [i["rank"] for i in inner.info()] == [2, 3]


def test_one_rank_view_gets_the_whole_batch(wg: WorkerGroup[Any]) -> None:
    data = batch(5)
    out = wg[2].echo(data)
    assert out.batch["rank"].tolist() == [2] * 5
    assert wg[2].dp_compute(["only"]) == [(2, ("only",), {})]


def test_view_binds_the_same_methods_and_errors(wg: WorkerGroup[Any]) -> None:
    view = wg[0:2]
    assert view.method_names == wg.method_names
    with pytest.raises(AttributeError, match="@register"):
        view.not_registered()
    with pytest.raises(DispatchError, match="directly"):
        view.generate_direct()
    assert "x2" in repr(view) and "EchoWorker" in repr(view)


def test_nd_mesh_view_without_a_collector_is_refused(wg: WorkerGroup[Any]) -> None:
    # Ranks 1 and 2 are dp ranks 0 and 1, but dp rank 0's collector (rank 0) is not in the view.
    with pytest.raises(DispatchError, match=r"no rank collects dp_rank\(s\) \[0\]"):
        wg.ranks([1, 2]).nd_echo(batch(4))


def test_trace_names_the_real_ranks(wg: WorkerGroup[Any]) -> None:
    with trace() as tracer:
        wg.ranks([1, 3]).info()
    tracks = {e["args"]["name"] for e in tracer.events if e.get("name") == "thread_name"}
    assert {t for t in tracks if "rank" in t} == {t for t in tracks if t.endswith(("rank 1", "rank 3"))}
    assert sum(t.endswith("rank 1") for t in tracks) == 1 and sum(t.endswith("rank 3") for t in tracks) == 1


def test_shutting_down_a_view_leaves_the_group() -> None:
    with WorkerGroup(EchoWorker, 3, backend="local") as group:
        view = group[0:2]
        view.shutdown()
        with pytest.raises(DispatchError, match="shut down"):
            view.info()
        assert len(group.info()) == 3
        other = group[1:]
    with pytest.raises(DispatchError, match="shut down"):
        other.info()


@pytest.mark.timeout(30)
def test_disjoint_views_run_independently() -> None:
    """Ranks 0-1 block until released; a call on ranks 2-3 must complete meanwhile."""
    _gate.clear()
    with WorkerGroup(GatedWorker, 4, backend="local") as group:
        try:
            held = group[0:2].wait_for_gate()
            assert group[2:].rank_of() == [2, 3]
            assert not held.done()
        finally:
            _gate.set()
        assert held.get() == [0, 1]


def test_replace_rank_on_a_view_names_the_groups_ranks(monkeypatch: pytest.MonkeyPatch) -> None:
    """A view's rank numbers are positions in it; replacement works on the whole group's ranks."""
    asked: list[tuple[int, ...]] = []

    def replace_ranks(ranks: tuple[int, ...]) -> dict[str, str]:
        asked.append(tuple(ranks))
        raise _Asked  # what the executor is asked for is all this test looks at

    with WorkerGroup(EchoWorker, 4, backend="local") as group:
        monkeypatch.setattr(group.executor, "replace_ranks", replace_ranks)
        with pytest.raises(_Asked):
            group.ranks([3, 1]).replace_rank(0)
        with pytest.raises(_Asked):
            group[2:].replace_rank(0, 1)
        with pytest.raises(ValueError, match=r"rank numbers in 0\.\.1"):
            group[2:].replace_rank(2)
    assert asked == [(3,), (2, 3)]


class _Asked(Exception):
    """Raised by the stand-in ``Executor.replace_ranks``: the replacement goes no further."""
