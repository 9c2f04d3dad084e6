"""Results as ranks finish: ``wg.m.stream(...)`` and ``dispatchcore.as_completed``, on every backend.

Order is proved by structure, never by timing: the rank told to finish
last waits until a file exists, and the test creates the file only once
the first part reached it, so no other order is possible.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import dispatchcore
from dispatchcore import CallInterrupted, DataProto, Dispatch, StreamPart, Worker, WorkerError, WorkerGroup, register
from executors_ray.testing import ray_session  # noqa: F401

BACKENDS = ["local", "torchrun", "ray", "multiprocess"]
pytestmark = pytest.mark.timeout(120)

# The worker class travels by value: Ray's worker processes cannot import this test module.
for _pickler in (pytest.importorskip("cloudpickle"), pytest.importorskip("ray.cloudpickle")):
    _pickler.register_pickle_by_value(sys.modules[__name__])


def _wait_for_file(gate: str | None) -> None:
    while gate is not None and not Path(gate).exists():
        time.sleep(0.01)


class Streamer(Worker):
    def __init__(self) -> None:
        self.interrupted = 0

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def double(self, batch: DataProto, first: int | None = None, gate: str | None = None) -> DataProto:
        """Every rank but ``first`` waits for ``gate`` to exist before it answers."""
        if first is not None and self.rank != first:
            _wait_for_file(gate)
        batch.batch["y"] = batch.batch["x"] * 2
        return batch

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def rank_or_forever(self, answering: int, started: str) -> int:
        """Rank ``answering`` answers once the others are in; they nap until the call is cancelled."""
        if self.rank == answering:
            while len(list(Path(started).parent.glob(Path(started).name + "*"))) < self.world_size - 1:
                time.sleep(0.01)
            return self.rank
        Path(f"{started}{self.rank}").touch()
        try:
            while True:
                time.sleep(0.02)
        except CallInterrupted:
            self.interrupted += 1
            raise

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def raise_on(self, rank: int) -> int:
        if self.rank == rank:
            raise ValueError(f"planted on rank {rank}")
        return self.rank

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def interrupts(self) -> int:
        return self.interrupted

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def later(self, gate: str | None = None) -> int:
        _wait_for_file(gate)
        return self.rank


@pytest.fixture(scope="module", params=BACKENDS)
def group(request: pytest.FixtureRequest) -> Iterator[WorkerGroup[Any]]:
    if request.param == "ray":
        request.getfixturevalue("ray_session")
    with WorkerGroup(Streamer, 2, backend=request.param) as wg:
        yield wg


def _batch(n: int) -> DataProto:
    return DataProto.from_dict({"x": torch.arange(float(n))}, auto_padding=True)


def test_the_rank_that_finishes_first_comes_first_with_its_rows(group: WorkerGroup[Any], tmp_path: Path) -> None:
    gate = tmp_path / "go"
    stream = group.double.stream(_batch(3), first=1, gate=str(gate))
    first = next(stream)
    gate.touch()
    rest = list(stream)
    assert isinstance(first, StreamPart) and first.ranks == (1,)
    assert first.rows == range(2, 3)  # 3 rows over 2 ranks: rank 1's second row is padding, dropped
    assert first.value.batch["y"].tolist() == [4.0]
    assert [(p.ranks, p.rows) for p in rest] == [((0,), range(0, 2))]
    assert rest[0].value.batch["y"].tolist() == [0.0, 2.0]


def test_ordered_parts_come_in_rank_order_and_make_the_whole_result(group: WorkerGroup[Any]) -> None:
    data = _batch(5)
    parts = list(group.double.stream(data, ordered=True))
    assert [p.ranks for p in parts] == [(0,), (1,)]
    assert [p.rows for p in parts] == [range(0, 3), range(3, 5)]
    whole = group.double(data)
    assert torch.equal(torch.cat([p.value.batch["y"] for p in parts]), whole.batch["y"])


def test_lazy_parts_stay_on_the_ranks_until_read(group: WorkerGroup[Any]) -> None:
    parts = list(group.double.options(lazy=True).stream(_batch(4), ordered=True))
    assert all(type(p.value).__name__ == "LazyDataProto" for p in parts)
    assert [p.value.batch["y"].tolist() for p in parts] == [[0.0, 2.0], [4.0, 6.0]]


def test_a_view_streams_its_own_ranks(group: WorkerGroup[Any]) -> None:
    (part,) = list(group[1:2].double.stream(_batch(3)))
    assert part.ranks == (1,) and part.rows == range(0, 3)
    assert part.value.batch["y"].tolist() == [0.0, 2.0, 4.0]


def test_leaving_the_loop_cancels_the_ranks_still_running(group: WorkerGroup[Any], tmp_path: Path) -> None:
    before = group.interrupts()
    for part in group.rank_or_forever.stream(0, str(tmp_path / "in-")):
        assert part.ranks == (0,) and part.value == 0
        break
    # The next call waits for rank 1 to leave the cancelled call; it was interrupted there.
    after = group.interrupts()
    assert after[0] == before[0] and after[1] == before[1] + 1


def test_a_rank_that_raises_ends_the_stream_with_its_error(group: WorkerGroup[Any]) -> None:
    with pytest.raises(WorkerError) as caught:
        list(group.raise_on.stream(1, ordered=True))
    assert caught.value.rank == 1 and "planted on rank 1" in str(caught.value)
    assert group.raise_on(-1) == [0, 1]


def test_as_completed_yields_futures_of_several_groups_as_they_finish(group: WorkerGroup[Any], tmp_path: Path) -> None:
    gate = tmp_path / "go"
    with WorkerGroup(Streamer, 1, backend="local") as other:
        slow = group.later(str(gate))
        fast = other.later()
        order = []
        for future in dispatchcore.as_completed([slow, fast], timeout=60):
            order.append(future)
            gate.touch()
        assert order == [fast, slow]
        assert slow.get() == [0, 1] and fast.get() == [0]
