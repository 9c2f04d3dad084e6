"""Property tests: dispatch then collect of an identity reproduces the input, for every built-in mode.

They run each mode through :func:`dispatchcore.direct_call`, the public way to
test a mode without a group.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dispatchcore import (
    BatchSizeError,
    DataProto,
    Dispatch,
    DispatchError,
    direct_call,
    make_nd_compute_dataproto_dispatch_fn,
)
from dispatchcore.testing import check_dispatch_mode, nd_meshes, strategies

world_sizes = strategies.world_sizes()
lengths = st.integers(min_value=1, max_value=80)


def first_argument(*args, **kwargs):
    """A rank that returns what it was given first (an identity worker)."""
    return args[0] if args else next(iter(kwargs.values()))


def proto(n: int, padding: bool) -> DataProto:
    return DataProto.from_dict({"x": torch.arange(n), "y": torch.arange(2 * n).reshape(n, 2)}, auto_padding=padding)


# The public checker users run on their own modes: any batch (every column kind,
# padding on or off), any world size, round trip, order and padding.
@pytest.mark.parametrize("keyword", [None, "data"])
def test_dp_compute_proto_keeps_every_property(keyword: str | None) -> None:
    check_dispatch_mode(Dispatch.DP_COMPUTE_PROTO, keyword=keyword, max_examples=50)


def test_dp_compute_metric_and_with_func_keep_every_property() -> None:
    check_dispatch_mode(Dispatch.DP_COMPUTE_METRIC, collects="per_rank", max_examples=50)
    check_dispatch_mode(Dispatch.DP_COMPUTE_PROTO_WITH_FUNC, leading_args=(lambda d: d,), max_examples=50)


def test_nd_mode_keeps_every_property_on_any_layout() -> None:
    mode = make_nd_compute_dataproto_dispatch_fn("prop")
    check_dispatch_mode(mode, meshes=lambda n: nd_meshes("prop", n), max_examples=50)


@settings(deadline=None, max_examples=60)
@given(n=world_sizes, length=lengths, padding=st.booleans(), as_kwarg=st.booleans())
def test_dp_compute_proto_round_trips(n: int, length: int, padding: bool, as_kwarg: bool) -> None:
    data = proto(length, padding)
    if length % n and not padding:
        with pytest.raises(BatchSizeError, match="auto_padding"):
            direct_call(Dispatch.DP_COMPUTE_PROTO, n, (data,))
        return
    for mode in (Dispatch.DP_COMPUTE_PROTO, Dispatch.DP_COMPUTE_METRIC):
        call = direct_call(mode, n, kwargs={"data": data}) if as_kwarg else direct_call(mode, n, (data,))
        chunks = call.kwargs["data"] if as_kwarg else call.args[0]
        assert len({len(c) for c in chunks}) == 1, "chunks must be equal-sized"
        result = call.run(first_argument)
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
    call = direct_call(Dispatch.DP_COMPUTE_PROTO_WITH_FUNC, n, (fn, data))
    assert all(f is fn for f in call.args[0])
    result = call.run(lambda f, d: f(d))
    assert torch.equal(result.batch["x"], data.batch["x"])


@settings(deadline=None, max_examples=40)
@given(n=world_sizes, values=st.lists(st.integers(), min_size=1, max_size=4))
def test_list_modes_round_trip(n: int, values: list[int]) -> None:
    per_rank = [[v + r for r in range(n)] for v in values]
    assert direct_call(Dispatch.DP_COMPUTE, n, per_rank).run(first_argument) == per_rank[0]
    assert direct_call(Dispatch.DP_COMPUTE, n, [tuple(p) for p in per_rank]).run(first_argument) == per_rank[0]
    assert direct_call(Dispatch.ALL_TO_ALL, n, per_rank).run(first_argument) == per_rank[0]
    call = direct_call(Dispatch.ONE_TO_ALL, n, values)
    assert call.run(first_argument) == [values[0]] * n
    assert all(a is call.args[0][0] for a in call.args[0]), "broadcast must be one object, shipped once"
    assert direct_call(Dispatch.RANK_ZERO, n, values).run(first_argument) == values[0]


@settings(deadline=None, max_examples=60)
@given(dp=st.integers(1, 6), replicas=st.integers(1, 4), length=lengths, data=st.data())
def test_nd_round_trips(dp: int, replicas: int, length: int, data: st.DataObject) -> None:
    n = dp * replicas
    # Any placement of dp ranks over the world, one collector per dp rank.
    order = data.draw(st.permutations(list(range(n))))
    mesh = [(order[r] // replicas, order[r] % replicas == 0) for r in range(n)]
    batch = proto(length, True)
    call = direct_call(make_nd_compute_dataproto_dispatch_fn("prop"), n, (batch,), mesh={"prop": mesh})
    assert torch.equal(call.run(first_argument).batch["x"], batch.batch["x"])
    for r in range(n):
        for s in range(n):
            if mesh[r][0] == mesh[s][0]:
                assert call.args[0][r] is call.args[0][s], "replicas of a dp rank must share one chunk"


def test_direct_dispatch_functions_keep_no_state_between_calls() -> None:
    """Regression: a padded 5-row dispatch must not poison a later 8-row one."""

    class Group:
        world_size = 2

    dispatch_dp_compute_proto = direct_call(Dispatch.DP_COMPUTE_PROTO, 1).spec.dispatch_fn  # the mode's own
    first, _ = dispatch_dp_compute_proto(Group(), proto(5, True))
    second, _ = dispatch_dp_compute_proto(Group(), proto(8, False))
    assert [len(c) for c in first[0]] == [3, 3]
    assert [len(c) for c in second[0]] == [4, 4]


def test_direct_calls_are_independent() -> None:
    padded = direct_call(Dispatch.DP_COMPUTE_PROTO, 4, (proto(5, True),))
    plain = direct_call(Dispatch.DP_COMPUTE_PROTO, 4, (proto(8, False),))
    assert len(padded.run(first_argument)) == 5, "padding rows trimmed by the call's own context"
    assert len(plain.run(first_argument)) == 8


def test_direct_call_refuses_bad_input() -> None:
    with pytest.raises(ValueError, match="world_size"):
        direct_call(Dispatch.ONE_TO_ALL, 0, (1,))
    with pytest.raises(DispatchError, match="mesh="):
        direct_call(make_nd_compute_dataproto_dispatch_fn("m"), 2, (proto(4, False),))
    with pytest.raises(ValueError, match="2 ranks"):
        direct_call(make_nd_compute_dataproto_dispatch_fn("m"), 3, (proto(3, False),), mesh={"m": [(0, True)] * 2})
    call = direct_call(Dispatch.ONE_TO_ALL, 3, (1,))
    with pytest.raises(ValueError, match="one output per rank"):
        call.collect([1, 2])
