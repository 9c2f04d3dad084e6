"""The ``mock`` executor (``dispatchcore.testing.MockExecutor``): found by its entry point, runs calls in-thread."""

from __future__ import annotations

import pytest
import torch

from dispatchcore import DataProto, Dispatch, Execute, Worker, WorkerError, WorkerGroup, available_backends, register
from dispatchcore.testing import MockExecutor


class Doubler(Worker):
    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def double(self, data: DataProto) -> DataProto:
        data.batch["x"] *= 2  # writes a private copy (isolation)
        return DataProto.from_dict({"x": data.batch["x"], "rank": torch.full((len(data),), self.rank)})

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, execute_mode=Execute.RANK_ZERO)
    def fail(self) -> None:
        raise ValueError("bad config")


def test_mock_is_registered_through_its_entry_point() -> None:
    assert "mock" in available_backends()
    with WorkerGroup(Doubler, world_size=2, backend="mock") as wg:
        assert isinstance(wg.executor, MockExecutor)


def test_mock_dispatches_pads_isolates_and_collects_in_rank_order() -> None:
    batch = DataProto.from_dict({"x": torch.arange(5)}, auto_padding=True)
    with WorkerGroup(Doubler, world_size=2, backend="mock") as wg:
        out = wg.double(batch)
        assert out.batch["x"].tolist() == [0, 2, 4, 6, 8]
        assert out.batch["rank"].tolist() == [0, 0, 0, 1, 1]
        assert batch.batch["x"].tolist() == [0, 1, 2, 3, 4]  # the caller's batch is untouched
        with pytest.raises(WorkerError, match="bad config") as info:
            wg.fail()
        assert (info.value.rank, info.value.method) == (0, "fail")


def test_mock_keeps_lazy_rows_on_the_ranks_through_the_call_instructions() -> None:
    with WorkerGroup(Doubler, world_size=2, backend="mock") as wg:
        out = wg.double.options(lazy=True)(DataProto.from_dict({"x": torch.arange(4)}))
        assert out.is_lazy and len(out) == 4
        assert out.batch["x"].tolist() == [0, 2, 4, 6]
