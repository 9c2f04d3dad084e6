"""FSDP2 weights offered as they are: DTensors (``Shard(0)``, ``Replicate``, HSDP's 2-D placement) and ``verify``.

The rank-side reading is checked without process groups first (the row
arithmetic against ``torch.chunk``, refusals on fake hosts); then on real
gloo process groups in self-started torchrun ranks and Ray actors: the
trainer builds its DTensors with ``fully_shard`` or ``distribute_tensor``
(torch's own split, so the offsets are checked against torch, uneven
shards included), the rollout's weights must equal the full parameters
exactly, and a bad offer is refused by name with every process alive.
2-D meshes run as 2x1 and 1x2 on both backends and as 2x2 HSDP (four
trainer ranks) on torchrun only; the row arithmetic of any mesh is in the
property test.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from dispatchcore import (
    RowShard,
    Shard,
    WeightMismatchError,
    WeightOfferError,
    WeightSync,
    WeightTypeError,
    WorkerGroup,
)
from dispatchcore._transfer import shard_rows
from dispatchcore.executor import run_step
from dtensor_workers import FsdpTrainer, Rollout, full_weights

# -- without process groups ----------------------------------------------------------------------


@given(st.integers(0, 40), st.lists(st.integers(1, 5), min_size=0, max_size=3))
def test_shard_rows_are_torch_chunks_nested_in_mesh_order(length: int, sizes: list[int]) -> None:
    """Every mesh coordinate's rows equal ``torch.chunk`` applied per mesh dim (2x2 HSDP included)."""
    rows = torch.arange(length)
    for coordinate in itertools.product(*(range(n) for n in sizes)):
        part = rows
        for n, c in zip(sizes, coordinate, strict=True):
            chunks = part.chunk(n) if len(part) else ()
            part = chunks[c] if c < len(chunks) else part[len(part) :]
        offset, count = shard_rows(length, list(zip(sizes, coordinate, strict=True)))
        assert count == len(part)
        assert torch.equal(rows[offset : offset + count], part)


class _Odd(torch.Tensor):
    """A tensor subclass no transport can send."""


class _Offers:
    def __init__(self, offered: dict[str, Any]) -> None:
        self.offered = offered

    def weights(self) -> dict[str, Any]:
        return self.offered


def _layout(offered: dict[str, Any]) -> Any:
    host = SimpleNamespace(worker=_Offers(offered), transfers={}, tensor_link=None)
    return run_step(host, (("layout", 1, "weights"),)), host


def test_a_tensor_subclass_or_non_tensor_is_refused_by_name_and_nothing_is_kept() -> None:
    odd = torch.Tensor._make_subclass(_Odd, torch.zeros(3))
    for bad, what in [(odd, "_Odd"), ([1.0, 2.0], "list"), (RowShard.__new__(RowShard), None)]:
        if what is None:  # a RowShard whose tensor is a subclass
            object.__setattr__(bad, "tensor", odd)
            object.__setattr__(bad, "offset", 0)
            object.__setattr__(bad, "full_shape", (3,))
            what = "_Odd"
        with pytest.raises(WeightTypeError, match=rf"'bad'.*{what}") as info:
            _layout({"fine": torch.ones(2), "bad": bad})
        assert isinstance(info.value, TypeError) and isinstance(info.value, ValueError)


def test_meta_tensors_are_refused_and_shard_is_rowshard() -> None:
    with pytest.raises(WeightOfferError, match="'w' is a tensor on the meta device"):
        _layout({"w": torch.empty(2, device="meta")})
    assert Shard is RowShard
    held, _ = _layout({"p": torch.nn.Parameter(torch.ones(4, 2)), "s": Shard(torch.ones(1, 2), 3, (4, 2))})
    assert (held["p"].offset, held["p"].rows, held["s"].offset, held["s"].rows) == (0, 4, 3, 1)


# -- on process groups ---------------------------------------------------------------------------


@pytest.fixture(scope="module", params=[pytest.param("torchrun", marks=pytest.mark.slow), "ray"])
def groups(request: pytest.FixtureRequest) -> Iterator[tuple[WorkerGroup[Any], WorkerGroup[Any]]]:
    if request.param == "ray":
        request.getfixturevalue("ray_session")
    with (
        WorkerGroup(FsdpTrainer, 2, backend=request.param) as src,
        WorkerGroup(Rollout, 1, backend=request.param) as dst,
    ):
        yield src, dst


def _equal_to_full(dst: WorkerGroup[Any], version: Any) -> None:
    full = full_weights()
    for got, seen in dst.state():
        assert seen == version
        assert set(got) == set(full)
        for name, t in full.items():
            assert got[name].dtype == t.dtype and torch.equal(got[name], t), name


@pytest.mark.timeout(240)
@pytest.mark.parametrize("kind", ["fsdp", "state_dict", "replicate", "hsdp_2x1", "hsdp_1x2"])
def test_dtensors_arrive_equal_to_the_full_parameters(groups: Any, kind: str) -> None:
    src, dst = groups
    src.configure(kind)
    sync = WeightSync(src, dst, bucket_bytes=48, verify=True)
    report = sync(version=kind)
    assert report.verified and report.transport == src.backend and report.driver_bytes == 0
    _equal_to_full(dst, kind)
    # Replicas (Replicate, HSDP's replicate dim) take turns: every byte leaves one source once.
    assert sync.last_plan is not None and sync.last_plan.nbytes == sum(t.nbytes for t in full_weights().values())
    if kind in ("replicate", "hsdp_2x1"):  # and both replicas send a share
        assert {bucket.source for bucket in sync.last_plan.buckets} == {0, 1}
    assert sync.verify() == sorted(full_weights())


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_hsdp_2x2_on_four_torchrun_ranks() -> None:
    with (
        WorkerGroup(FsdpTrainer, 4, backend="torchrun") as src,
        WorkerGroup(Rollout, 1, backend="torchrun") as dst,
    ):
        src.configure("hsdp_2x2")
        sync = WeightSync(src, dst, bucket_bytes=48, verify=True)
        assert sync(version="2x2").verified
        _equal_to_full(dst, "2x2")
        assert sync.last_plan is not None and sync.last_plan.nbytes == sum(t.nbytes for t in full_weights().values())
        assert {bucket.source for bucket in sync.last_plan.buckets} == {0, 1, 2, 3}  # both replicas, both shards


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    ("kind", "error", "says"),
    [
        ("shard1", WeightOfferError, r"'0\.weight'.*Shard\(dim=1\)"),
        ("partial", WeightOfferError, r"'0\.weight'.*Partial"),
    ],
)
def test_a_bad_offer_is_refused_by_name_and_every_process_lives(groups: Any, kind: str, error: type, says: str) -> None:
    src, dst = groups
    src.configure("fsdp")
    WeightSync(src, dst)(version="before")
    src.configure(kind)
    with pytest.raises(error, match=says) as info:
        WeightSync(src, dst)(version="refused")
    assert isinstance(info.value, ValueError)
    assert src.alive() == [0, 1]
    assert dst.state()[0][1] == "before"  # nothing committed
    src.configure("fsdp")
    WeightSync(src, dst)(version="after")
    _equal_to_full(dst, "after")


@pytest.mark.timeout(240)
def test_verify_names_the_parameter_and_rank_that_differ(groups: Any) -> None:
    src, dst = groups
    src.configure("fsdp")
    sync = WeightSync(src, dst)
    sync(version=1)
    dst.corrupt("3.bias")
    with pytest.raises(WeightMismatchError, match=r"'3\.bias' on destination rank \d+ \(other bytes") as info:
        sync.verify()
    assert [name for name, _, _ in info.value.mismatches] == ["3.bias"]
    dst.spoil("0.weight")  # load_weights now keeps other bytes than it got
    with pytest.raises(WeightMismatchError, match=r"'0\.weight' on destination rank"):
        WeightSync(src, dst, verify=True)(version=2)
    assert dst.state()[0][1] == 1  # checked before the version: it never moved
    dst.spoil(None)
    assert WeightSync(src, dst, verify=True)(version=3).verified
    _equal_to_full(dst, 3)
