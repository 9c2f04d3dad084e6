"""Staleness policies as small objects, a user's own in a few lines, and every bad input named with its fix."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pytest
import torch

from dispatchcore import (
    AheadBound,
    DataProto,
    Dispatch,
    DispatchRuntimeError,
    DispatchTypeError,
    DispatchValueError,
    MaxStaleness,
    RolloutBatch,
    RolloutStream,
    StalenessPolicy,
    StreamState,
    WeightSync,
    Worker,
    WorkerGroup,
    create_colocated_worker_cls,
    register,
    versioned,
    weights_version_of,
)

pytestmark = pytest.mark.timeout(60)


def _state(consumed: int = 0, live: int = 0, trainer: int = 0, rollout: int = 0, per_step: int = 1) -> StreamState:
    return StreamState(consumed, live, trainer, rollout, 0, per_step)


def test_max_staleness_admits_what_would_be_consumed_within_k() -> None:
    policy = MaxStaleness(1)
    assert policy.admit(_state(live=1, per_step=1))  # the 2nd batch is consumed at version 1: 1 - 0 <= 1
    assert not policy.admit(_state(live=2, per_step=1))  # the 3rd at version 2: too old
    assert policy.admit(_state(consumed=2, live=1, trainer=2, rollout=2))
    assert MaxStaleness(0).admit(_state(live=3, per_step=4)) and not MaxStaleness(0).admit(_state(live=4, per_step=4))


def test_max_staleness_evicts_and_orders() -> None:
    old, new = RolloutBatch(0, 0, None, version=1), RolloutBatch(1, 1, None, version=3)
    assert MaxStaleness(1).evict(old, _state(trainer=3)) and not MaxStaleness(1).evict(new, _state(trainer=3))
    assert MaxStaleness(2).select([new, old], 1, _state()) == [old]  # ready-first takes the oldest version first
    waiting = StreamState(0, 3, 0, 0, 0, 1, first_generating=0)
    late = RolloutBatch(2, 0, None)
    assert MaxStaleness(2, order="in_order").select([late], 1, waiting) == []  # batch 0 still generating
    assert AheadBound(1).admit(_state(live=1)) and not AheadBound(1).admit(_state(live=2))
    assert not AheadBound(0).evict(old, _state(trainer=9))  # bounds admission only


class NewestFirst(StalenessPolicy):
    """A user's policy: train on the freshest rows first, never on rows three versions old."""

    def select(self, ready: Sequence[RolloutBatch], want: int, state: StreamState) -> list[RolloutBatch]:
        return sorted(ready, key=lambda b: -b.version)[:want]

    def evict(self, batch: RolloutBatch, state: StreamState) -> bool:
        return batch.staleness(state.trainer_version) >= 3


def test_a_users_policy_in_a_few_lines() -> None:
    a, b = RolloutBatch(0, 0, None, version=0), RolloutBatch(1, 0, None, version=2)
    assert NewestFirst().select([a, b], 1, _state()) == [b]
    assert NewestFirst().evict(a, _state(trainer=3)) and NewestFirst().admit(_state(live=100))


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: MaxStaleness(-1), "k must be an int >= 0"),
        (lambda: MaxStaleness(1, order="fifo"), "order must be one of"),
        (lambda: MaxStaleness(1, on_stale="keep"), "on_stale must be one of"),
        (lambda: AheadBound(-2), "steps ahead must be"),
    ],
)
def test_bad_policy_settings_are_named(make: object, match: str) -> None:
    with pytest.raises(DispatchValueError, match=match):
        make()  # type: ignore[operator]


class Gen(Worker):
    @register(Dispatch.DP_COMPUTE_PROTO)
    @versioned
    def generate(self, prompts: DataProto) -> DataProto:
        return DataProto.from_dict({"x": prompts.batch["p"] + 1})

    @register(Dispatch.ONE_TO_ALL)
    def set_version(self, version: int) -> None:
        self.weights_version = version  # what WeightSync's commit does; a caller updating weights itself does it too

    @register(Dispatch.DP_COMPUTE_PROTO)
    def plain(self, prompts: DataProto) -> DataProto:
        return DataProto.from_dict({"x": prompts.batch["p"]})


@pytest.fixture(scope="module")
def gen() -> Iterator[WorkerGroup[Gen]]:
    with WorkerGroup(Gen, 2) as wg:
        yield wg


PROMPTS = DataProto.from_dict({"p": torch.arange(8)})


def test_bad_stream_inputs_are_named(gen: WorkerGroup[Gen]) -> None:
    with pytest.raises(DispatchTypeError, match=r"rollout group's method, e.g. RolloutStream\(rollout_wg.generate"):
        RolloutStream(print, PROMPTS, batch_size=2)
    with pytest.raises(DispatchValueError, match="needs batch_size="):
        RolloutStream(gen.generate, PROMPTS)
    with pytest.raises(DispatchValueError, match=r"batch_size must be an int in 1\.\.8"):
        RolloutStream(gen.generate, PROMPTS, batch_size=9)
    with pytest.raises(DispatchTypeError, match="prompts must be a DataProto"):
        RolloutStream(gen.generate, 3, batch_size=2)
    with pytest.raises(DispatchTypeError, match="policy must be a StalenessPolicy"):
        RolloutStream(gen.generate, PROMPTS, batch_size=2, policy=1)  # type: ignore[arg-type]
    with pytest.raises(DispatchValueError, match="batches_per_step must be an int >= 1"):
        RolloutStream(gen.generate, PROMPTS, batch_size=2, batches_per_step=0)


def test_a_method_without_versioned_is_named_at_take(gen: WorkerGroup[Gen]) -> None:
    with RolloutStream(gen.plain, PROMPTS, batch_size=2, max_attempts=1) as stream:
        with pytest.raises(DispatchTypeError, match="decorate it with @versioned"):
            stream.take(timeout=30)


def test_a_bound_the_trainer_never_moves_says_publish(gen: WorkerGroup[Gen]) -> None:
    with RolloutStream(gen.generate, PROMPTS, batch_size=2, policy=MaxStaleness(0), batches_per_step=2) as stream:
        step = stream.take(timeout=30)
        assert step.staleness == [0, 0] and len(step.data) == 4
        with pytest.raises(DispatchRuntimeError, match=r"call stream.publish\(version\) after each training step"):
            stream.take(timeout=30)
        with pytest.raises(DispatchValueError, match="the trainer is at version 0 already"):
            stream.publish(-1)
        gen.set_version(1)  # the caller updates the ranks itself (no weights_from=), then publishes
        stream.publish(1)
        step = stream.take(timeout=30)
        assert step.trainer_version == 1 and step.staleness == [0, 0]
    gen.set_version(None)


def test_ranks_that_were_not_updated_are_named(gen: WorkerGroup[Gen]) -> None:
    with RolloutStream(gen.generate, PROMPTS, batch_size=2, policy=MaxStaleness(0), batches_per_step=2) as stream:
        stream.take(timeout=30)
        stream.publish(1)  # but nobody updated the ranks
        with pytest.raises(DispatchRuntimeError, match="update the ranks' weights and weights_version yourself"):
            stream.take(timeout=30)


class Actor(Worker):
    def __init__(self) -> None:
        self.w = torch.ones(2)

    def weights(self) -> dict[str, torch.Tensor]:
        return {"w": self.w}


class Sampler(Worker):
    def load_weights(self, weights: list[tuple[str, torch.Tensor]]) -> None:
        self.w = weights[0][1].clone()

    @register(Dispatch.DP_COMPUTE_PROTO)
    @versioned
    def generate(self, prompts: DataProto) -> DataProto:
        return DataProto.from_dict({"v": torch.full((len(prompts),), weights_version_of(self) or 0)})


def test_a_colocated_role_reads_and_stamps_its_own_version() -> None:
    cls = create_colocated_worker_cls({"actor": Actor, "rollout": Sampler})
    with WorkerGroup(cls, 2) as wg:
        roles = wg.spawn(["actor", "rollout"])
        WeightSync(roles["actor"], roles["rollout"])(version=7)
        with RolloutStream(roles["rollout"].generate, PROMPTS, batch_size=2, initial_version=7) as stream:
            step = stream.take(timeout=30)
            assert step.batches[0].version == 7 and step.staleness == [0]
            assert step.data.batch["v"].tolist() == [7, 7]
