"""Property tests: dispatch then collect of an identity reproduces the input, for every built-in mode."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dispatchcore import DataProto, Dispatch, make_nd_compute_dataproto_dispatch_fn
from dispatchcore._call_context import CallContext, call_context
from dispatchcore._modes import resolve_mode

world_sizes = st.integers(min_value=1, max_value=16)
lengths = st.integers(min_value=1, max_value=80)


@dataclass
class FakeGroup:
    """Just what dispatch/collect functions read from a group."""

    world_size: int
    mesh: list[tuple[int, bool]] | None = None

    def _mesh_info(self, mesh_name: str) -> list[tuple[int, bool]]:
        assert self.mesh is not None
        return self.mesh


def run_identity(mode, wg, *args, **kwargs):
    """Dispatch, let every rank return its first argument, collect."""
    spec = resolve_mode(mode)
    ctx = CallContext("identity", wg.world_size)
    with call_context(ctx):
        per_args, per_kwargs = spec.dispatch_fn(wg, *args, **kwargs)
    for v in list(per_args) + list(per_kwargs.values()):
        assert len(v) == wg.world_size
    outputs = [per_args[0][r] if per_args else next(iter(per_kwargs.values()))[r] for r in range(wg.world_size)]
    with call_context(ctx):
        return spec.collect_fn(wg, outputs), per_args, per_kwargs


def proto(n: int, padding: bool) -> DataProto:
    return DataProto.from_dict({"x": torch.arange(n), "y": torch.arange(2 * n).reshape(n, 2)}, auto_padding=padding)


@settings(deadline=None, max_examples=60)
@given(n=world_sizes, length=lengths, padding=st.booleans(), as_kwarg=st.booleans())
def test_dp_compute_proto_round_trips(n: int, length: int, padding: bool, as_kwarg: bool) -> None:
    data = proto(length, padding)
    if length % n and not padding:
        return
    for mode in (Dispatch.DP_COMPUTE_PROTO, Dispatch.DP_COMPUTE_METRIC):
        if as_kwarg:
            result, _, per_kwargs = run_identity(mode, FakeGroup(n), data=data)
            chunks = per_kwargs["data"]
        else:
            result, per_args, _ = run_identity(mode, FakeGroup(n), data)
            chunks = per_args[0]
        assert len({len(c) for c in chunks}) == 1, "chunks must be equal-sized"
        if mode is Dispatch.DP_COMPUTE_PROTO:
            assert torch.equal(result.batch["x"], data.batch["x"])
            assert torch.equal(result.batch["y"], data.batch["y"])
        else:
            assert len(result) == n
    assert len(data) == length, "dispatch must not mutate the caller's batch"


@settings(deadline=None, max_examples=40)
@given(n=world_sizes, length=lengths)
def test_with_func_round_trips(n: int, length: int) -> None:
    data = proto(length, True)
    fn = lambda d: d  # noqa: E731
    spec = resolve_mode(Dispatch.DP_COMPUTE_PROTO_WITH_FUNC)
    ctx = CallContext("f", n)
    with call_context(ctx):
        per_args, _ = spec.dispatch_fn(FakeGroup(n), fn, data)
        assert all(f is fn for f in per_args[0])
        result = spec.collect_fn(FakeGroup(n), per_args[1])
    assert torch.equal(result.batch["x"], data.batch["x"])


@settings(deadline=None, max_examples=40)
@given(n=world_sizes, values=st.lists(st.integers(), min_size=1, max_size=4))
def test_list_modes_round_trip(n: int, values: list[int]) -> None:
    per_rank = [[v + r for r in range(n)] for v in values]
    result, _, _ = run_identity(Dispatch.DP_COMPUTE, FakeGroup(n), *per_rank)
    assert result == per_rank[0]
    result, _, _ = run_identity(Dispatch.DP_COMPUTE, FakeGroup(n), *[tuple(p) for p in per_rank])
    assert result == per_rank[0]
    result, _, _ = run_identity(Dispatch.ALL_TO_ALL, FakeGroup(n), *per_rank)
    assert result == per_rank[0]
    result, per_args, _ = run_identity(Dispatch.ONE_TO_ALL, FakeGroup(n), *values)
    assert result == [values[0]] * n
    assert all(a is per_args[0][0] for a in per_args[0]), "broadcast must be one object, shipped once"
    result, _, _ = run_identity(Dispatch.RANK_ZERO, FakeGroup(n), *values)
    assert result == values[0]


@settings(deadline=None, max_examples=60)
@given(dp=st.integers(1, 6), replicas=st.integers(1, 4), length=lengths, data=st.data())
def test_nd_round_trips(dp: int, replicas: int, length: int, data: st.DataObject) -> None:
    n = dp * replicas
    # Any placement of dp ranks over the world, one collector per dp rank.
    order = data.draw(st.permutations(list(range(n))))
    mesh = [(order[r] // replicas, order[r] % replicas == 0) for r in range(n)]
    batch = proto(length, True)
    result, per_args, _ = run_identity(make_nd_compute_dataproto_dispatch_fn("prop"), FakeGroup(n, mesh), batch)
    assert torch.equal(result.batch["x"], batch.batch["x"])
    for r in range(n):
        for s in range(n):
            if mesh[r][0] == mesh[s][0]:
                assert per_args[0][r] is per_args[0][s], "replicas of a dp rank must share one chunk"
