"""WeightSync refuses source replicas whose dtypes differ for one name (issue 40, item 9)."""

from __future__ import annotations

import pytest
import torch

from dispatchcore import Dispatch, WeightOfferError, WeightSync, Worker, WorkerGroup, register


class Replica(Worker):
    def __init__(self, mixed: bool) -> None:
        dtype = torch.bfloat16 if mixed and self.rank == 1 else torch.float32
        self.w = torch.ones(4, 2, dtype=dtype)
        self.b = torch.zeros(3)

    def weights(self) -> dict[str, torch.Tensor]:
        return {"b": self.b, "w": self.w}


class Sink(Worker):
    applied = 0

    def load_weights(self, named: list[tuple[str, torch.Tensor]]) -> None:
        type(self).applied += 1
        self.got = {**getattr(self, "got", {}), **dict(named)}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def dtypes(self) -> dict[str, torch.dtype]:
        return {name: t.dtype for name, t in self.got.items()}


def test_replicas_with_different_dtypes_are_refused_naming_the_name_and_dtypes() -> None:
    with (
        WorkerGroup(Replica, 2, backend="local", init_args=(True,)) as src,
        WorkerGroup(Sink, 1, backend="local") as dst,
    ):
        with pytest.raises(WeightOfferError) as info:
            WeightSync(src, dst)(1)
        message = str(info.value)
        assert "'w'" in message and "torch.float32" in message and "torch.bfloat16" in message
        assert "rank 0" in message and "rank 1" in message
        assert Sink.applied == 0  # refused before anything moved


def test_replicas_that_agree_still_sync() -> None:
    with (
        WorkerGroup(Replica, 2, backend="local", init_args=(False,)) as src,
        WorkerGroup(Sink, 1, backend="local") as dst,
    ):
        WeightSync(src, dst)(1)
        assert dst.dtypes() == [{"b": torch.float32, "w": torch.float32}]
