"""Errors that leave the user alone no more: each names what went wrong and the fix (issue 40, item 8)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from dispatchcore import (
    CallSignatureError,
    DataProto,
    Dispatch,
    DispatchAttributeError,
    DispatchTypeError,
    WeightSync,
    Worker,
    WorkerError,
    WorkerGroup,
    register,
)


class Rows(Worker):
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def whole(self, data: DataProto) -> DataProto:
        return data

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO, blocking=False)
    def later(self, data: DataProto) -> DataProto:
        return data

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def anything(self, *args: object, **kwargs: object) -> int:
        return len(args) + len(kwargs)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def plain_process_group(self) -> None:
        dist.init_process_group("gloo")


@pytest.fixture(scope="module")
def wg():
    with WorkerGroup(Rows, 2, backend="local") as group:
        yield group


def _batch() -> DataProto:
    return DataProto.from_dict({"x": torch.arange(4)})


def test_union_with_a_per_rank_list_says_to_pick_one(wg) -> None:
    mine = DataProto.from_dict({"y": torch.arange(4)})
    with pytest.raises(DispatchTypeError, match=r"a list of 2 .*ONE_TO_ALL.*result\[0\]"):
        mine.union(wg.whole(_batch()))


def test_union_with_a_future_says_to_call_get(wg) -> None:
    mine = DataProto.from_dict({"y": torch.arange(4)})
    future = wg.later(_batch())
    with pytest.raises(DispatchTypeError, match=r"DataProtoFuture .*blocking=False.*\.get\(\)"):
        mine.union(future)
    assert mine.union(future.get()).batch["x"].tolist() == [0, 1, 2, 3]


def test_self_as_a_keyword_is_a_signature_error(wg) -> None:
    with pytest.raises(CallSignatureError, match="self"):
        wg.whole(_batch(), self=1)
    with pytest.raises(CallSignatureError, match="self"):
        wg.anything(1, self=1)  # a method binding anything: refused before it is sent too
    assert wg.anything(1, x=2) == [2, 2]


def test_a_plain_init_process_group_on_local_names_the_backends_that_give_its_environment(wg) -> None:
    with pytest.raises(WorkerError) as info:
        wg.plain_process_group()
    message = str(info.value)
    assert "RANK expected" in message  # torch's own words stay
    assert "backend='torchrun'" in message and "threads of the driver process" in message
    assert wg.anything() == [0, 0]  # the group still serves


class Trainer(Worker):
    offered = 0

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def setup(self) -> None:
        self.w = torch.ones(3)

    def weights(self) -> dict[str, torch.Tensor]:
        type(self).offered += 1
        return {"w": self.w}


class Rollout(Worker):
    def load_weight(self, named: list[tuple[str, torch.Tensor]]) -> None:  # misspelt: load_weights
        self.got = dict(named)


def test_a_misspelt_apply_method_is_refused_before_anything_moves() -> None:
    with WorkerGroup(Trainer, 1, backend="local") as src, WorkerGroup(Rollout, 1, backend="local") as dst:
        src.setup()
        with pytest.raises(DispatchAttributeError) as info:
            WeightSync(src, dst)
        message = str(info.value)
        assert "Rollout" in message and "'load_weights'" in message and "did you mean 'load_weight'" in message
        assert "apply=" in message
        assert Trainer.offered == 0
        WeightSync(src, dst, apply="load_weight")(1)  # the fix the message names works
        assert Trainer.offered == 1
