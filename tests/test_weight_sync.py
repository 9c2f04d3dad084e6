"""Weight sync (``WeightSync``): the plan's properties, and transfers on local, Ray and through the driver.

The plan is checked by running the real rank-side steps on fake hosts (no
group, no threads), so Hypothesis can try many layouts fast.  The backend
cases use the conformance workers; Ray uses the session's one Ray.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from _stranger import knock_as_another_user
from dispatchcore import (
    Dispatch,
    Shard,
    Slice,
    WeightSync,
    Worker,
    WorkerDiedError,
    WorkerGroup,
    create_colocated_worker_cls,
    driver_traffic,
    register,
    trace,
)
from dispatchcore.executor import TensorSpec, plan_transfer, run_step
from dispatchcore.testing.weight_workers import WEIGHT_SET, WeightRollout, WeightTrainer, expected, make_weights
from executors_ray.testing import ray_session  # noqa: F401

pytestmark = pytest.mark.timeout(120)

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.int8, torch.bool, torch.float64]


class _Source:
    def __init__(self, offered: dict[str, Any]) -> None:
        self.offered = offered

    def weights(self) -> dict[str, Any]:
        return self.offered


class _Sink:
    def __init__(self, wants: dict[str, Slice]) -> None:
        self.wants, self.got, self.calls = wants, {}, 0

    def weight_slices(self, shapes: dict[str, Any]) -> dict[str, Slice]:
        return self.wants

    def load_weights(self, weights: list[tuple[str, torch.Tensor]]) -> None:
        self.calls += 1
        for name, t in weights:
            assert name not in self.got
            self.got[name] = t.clone()


class _Bytes:
    """A link between processes, as torchrun's bridge: the pieces' bytes land in the places given, or its own."""

    same_process = False

    def publish(self, tensors: list[torch.Tensor], readers: int) -> list[torch.Tensor]:
        return [t.reshape(-1).view(torch.uint8).clone() for t in tensors]

    def receive(self, token: list[torch.Tensor], into: list[torch.Tensor | None]) -> Any:
        for b, t in zip(token, into, strict=True):
            if t is not None:
                t.reshape(-1).view(torch.uint8).copy_(b)
        got = [b if t is None else t for b, t in zip(token, into, strict=True)]
        return lambda: (got, False)


def _host(worker: Any, link: Any = None) -> Any:
    return SimpleNamespace(worker=worker, transfers={}, tensor_link=link)


def _transfer(sources: list[Any], sinks: list[Any], bucket_bytes: int, version: int = 1, link: Any = None) -> Any:
    """What ``WeightSync`` does, step by step, on fake hosts: the plan it made."""
    src, dst = [_host(w, link) for w in sources], [_host(w, link) for w in sinks]
    held = [run_step(h, (("layout", 1, "weights"),)) for h in src]
    tensors = {}
    for offered in held:
        for name, h in offered.items():
            tensors.setdefault(name, TensorSpec(name, h.full_shape, h.dtype))
    shapes = {n: (s.full_shape, s.dtype) for n, s in tensors.items()}
    wants = [run_step(h, (("want", 1, "weight_slices", shapes),)) for h in dst]
    plan = plan_transfer(held, tensors, wants, bucket_bytes)
    begins: list[Any] = [(plan.wanted[d], "load_weights", False, "weight_buffers") for d in range(len(dst))]
    for bucket in plan.buckets:
        token = run_step(src[bucket.source], (("pack", 1, bucket),))
        for d in bucket.destinations:
            run_step(dst[d], (("move", 1, bucket, begins[d], [bucket.index]), token))
            begins[d] = None
    for d, h in enumerate(dst):
        assert run_step(h, (("commit", 1, version, begins[d]),)) == version
    return plan


@st.composite
def layouts(draw: Any) -> tuple[dict[str, torch.Tensor], list[dict[str, Any]], list[dict[str, Slice]], int]:
    count = draw(st.integers(0, 4))
    full: dict[str, torch.Tensor] = {}
    for i in range(count):
        shape = tuple(draw(st.lists(st.integers(0, 7), min_size=0, max_size=3)))
        dtype = draw(st.sampled_from(DTYPES))
        values = torch.randn(shape) * 10
        full[f"w{i}"] = values > 0 if dtype == torch.bool else values.to(dtype)
    n_src = draw(st.integers(1, 3))
    sources: list[dict[str, Any]] = [{} for _ in range(n_src)]
    for name, t in full.items():
        if t.dim() == 0 or draw(st.booleans()):
            for s in draw(st.sets(st.integers(0, n_src - 1), min_size=1)):
                sources[s][name] = t.clone()  # whole, on one or more ranks (replicas)
            continue
        cuts = sorted(draw(st.lists(st.integers(0, t.shape[0]), max_size=n_src - 1)))
        edges = [0, *cuts, t.shape[0]]
        for s, (lo, hi) in enumerate(itertools.pairwise(edges)):
            sources[s][name] = Shard(t[lo:hi].clone(), lo, tuple(t.shape))
    wants: list[dict[str, Slice]] = []
    for _ in range(draw(st.integers(1, 3))):
        want = {}
        for name, t in full.items():
            if t.dim() and draw(st.booleans()):
                dim = draw(st.integers(0, t.dim() - 1))
                lo = draw(st.integers(0, t.shape[dim]))
                want[name] = Slice(dim, lo, draw(st.integers(lo, t.shape[dim])))
        wants.append(want)
    return full, sources, wants, draw(st.integers(1, 400))


@pytest.mark.parametrize("link", [None, _Bytes()], ids=["through the driver", "between processes"])
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layouts())
def test_plan_moves_every_value_exactly(link: Any, layout: Any) -> None:
    """Between processes small pieces travel packed: every dtype and shape comes out whole all the same."""
    full, offered, wants, bucket_bytes = layout
    sinks = [_Sink(w) for w in wants]
    plan = _transfer([_Source(o) for o in offered], sinks, bucket_bytes, link=link)
    for sink in sinks:
        assert set(sink.got) == set(full)
        for name, t in full.items():
            want = sink.wants.get(name)
            ref = t if want is None else t.narrow(want.dim, want.start, want.stop - want.start)
            assert sink.got[name].dtype == t.dtype and torch.equal(sink.got[name], ref), name
    for bucket in plan.buckets:  # a bucket is full-sized or one row that could not be split
        one_row = len(bucket.pieces) == 1 and (not bucket.pieces[0].shape or bucket.pieces[0].shape[0] == 1)
        assert bucket.nbytes <= bucket_bytes or one_row


@settings(max_examples=50, deadline=None)
@given(layouts())
def test_whole_destinations_share_every_send(layout: Any) -> None:
    """Destinations that all want every tensor whole are sent each byte once, whatever their number."""
    full, offered, _, bucket_bytes = layout
    plan = _transfer([_Source(o) for o in offered], [_Sink({}), _Sink({}), _Sink({})], bucket_bytes)
    assert plan.nbytes == sum(t.nbytes for t in full.values())
    assert all(b.destinations == (0, 1, 2) for b in plan.buckets)


def test_bucket_boundaries_fall_inside_a_tensor() -> None:
    t = torch.arange(40.0).reshape(10, 4)  # 16 bytes a row; 40-byte buckets hold 2 rows
    sink = _Sink({})
    plan = _transfer([_Source({"t": t})], [sink], bucket_bytes=40)
    assert len(plan.buckets) == 5 and sink.calls == 1  # the hook sees the tensor once, whole
    assert torch.equal(sink.got["t"], t)


def test_empty_set_commits_the_version() -> None:
    sink = _Sink({})
    assert _transfer([_Source({})], [sink], bucket_bytes=10, version=3).buckets == ()
    assert sink.calls == 0 and sink.got == {}


def test_rows_held_by_no_source_are_refused() -> None:
    t = torch.zeros(6, 2)
    with pytest.raises(ValueError, match=r"rows 3\.\.6 of 'w'"):
        _transfer([_Source({"w": Shard(t[:3], 0, (6, 2))})], [_Sink({})], bucket_bytes=64)


# -- on backends ---------------------------------------------------------------------------------
BACKENDS = ["local", "ray", "multiprocess"]


@pytest.fixture(scope="module", params=BACKENDS)
def groups(request: pytest.FixtureRequest) -> Iterator[tuple[WorkerGroup[Any], WorkerGroup[Any]]]:
    if request.param == "ray":
        request.getfixturevalue("ray_session")
    with (
        WorkerGroup(WeightTrainer, 2, backend=request.param) as src,
        WorkerGroup(WeightRollout, 2, backend=request.param) as dst,
    ):
        yield src, dst


def _check(dst: WorkerGroup[Any], cut: int | None, version: int, step: int = 0, **how: Any) -> None:
    full = make_weights(step=step)
    for rank, (got, seen_version, _) in enumerate(dst.state()):
        assert seen_version == version
        for name, t in full.items():
            ref = expected(t, cut, rank, 2)
            if "dtype" in how and t.is_floating_point():
                ref = ref.to(how["dtype"])
            assert got[how.get("prefix", "") + name].dtype == ref.dtype
            assert torch.equal(got[how.get("prefix", "") + name], ref), name


@pytest.mark.parametrize("cut", [None, 0, 1])
def test_sharded_trainer_to_rollout(groups: Any, cut: int | None) -> None:
    src, dst = groups
    dst.configure(cut=cut)
    before = driver_traffic()
    report = WeightSync(src, dst, bucket_bytes=100)(version=5)
    crossed = (driver_traffic() - before).total
    _check(dst, cut, 5)
    assert report.buckets > 8  # boundaries inside tensors
    if src.backend == "multiprocess":
        assert report.transport == "driver" and crossed >= report.bytes_moved > 0
    else:
        assert report.transport == src.backend and crossed == 0 and report.driver_bytes == 0


def test_rename_cast_subset_and_future(groups: Any) -> None:
    src, dst = groups
    dst.configure()
    src.set_step(3)
    sync = WeightSync(src, dst, rename=lambda n: f"m.{n}", dtype=None, names=lambda n: n.startswith("layer"))
    assert sync.start(version=1).get(timeout=60).tensors == 3
    received = dst.state()[0][0]
    assert sorted(received) == ["m.layer.0.bias", "m.layer.0.qkv", "m.layer.1.w"]
    dst.configure()
    cast = WeightSync(src, dst, dtype=torch.float16, bucket_bytes=1 << 20)
    cast(version=2)
    _check(dst, None, 2, step=3, dtype=torch.float16)
    src.set_step(0)


@pytest.mark.parametrize("groups", ["ray"], indirect=True)
def test_source_death_is_named_and_never_committed(groups: Any) -> None:
    _, dst = groups
    # Buckets of 1.5 MiB go over the bridge, rank to rank: those after the kill find their source gone.
    big = {**WEIGHT_SET, "big": ((2800, 1024), "float32")}  # 11 MiB: 8 buckets
    with WorkerGroup(WeightTrainer, 2, backend="ray", death_timeout=10, init_args=(big,)) as src:
        pids = src.set_step(0)
        dst.configure(kill=(pids[1], 1))
        with pytest.raises(WorkerDiedError) as info:
            WeightSync(src, dst, bucket_bytes=3 << 19)(version=9)
        assert info.value.rank == 1 and "source group" in str(info.value)
    states = dst.state()
    if [state[1] for state in states] == [9, 9]:
        # The bridge ran ahead of the applies: every byte had arrived before the kill, so the version is whole.
        for got, _, _ in states:
            assert all(torch.equal(got[name], full) for name, full in make_weights(big).items())
    else:
        assert 9 not in [state[1] for state in states]  # never told a version 9 it does not hold whole
    dst.configure()


@pytest.mark.parametrize("groups", ["ray"], indirect=True)
def test_destination_death_is_named(groups: Any) -> None:
    src, _ = groups
    with WorkerGroup(WeightRollout, 2, backend="ray", death_timeout=10) as dst:
        dst.configure(die_on=2)
        with pytest.raises(WorkerDiedError) as info:
            WeightSync(src, dst, bucket_bytes=64)(version=9)
        assert info.value.rank == 1 and "destination group" in str(info.value)
    assert len(src.set_step(0)) == 2  # the source group goes on


_HELD = torch.arange(12.0).reshape(3, 4)


class _Holder(Worker):
    def weights(self) -> dict[str, torch.Tensor]:
        return {"t": _HELD}


class _Pointers(Worker):
    def __init__(self) -> None:
        self.pointers: dict[str, int] = {}

    def load_weights(self, weights: list[tuple[str, torch.Tensor]]) -> None:
        self.pointers.update({name: t.data_ptr() for name, t in weights})
        self.kept = weights  # alive, so a freed (and reused) buffer's address is never compared

    @register(Dispatch.ONE_TO_ALL)
    def seen(self) -> dict[str, int]:
        return self.pointers


def test_local_copies_once_per_destination_and_not_for_isolate_false() -> None:
    with (
        WorkerGroup(_Holder, 1, backend="local") as src,
        WorkerGroup(_Pointers, 2, backend="local", isolate=False) as shared,
        WorkerGroup(_Pointers, 2, backend="local") as isolated,
    ):
        WeightSync(src, shared)(version=1)
        WeightSync(src, isolated)(version=1)
        assert [p["t"] for p in shared.seen()] == [_HELD.data_ptr()] * 2
        private = [p["t"] for p in isolated.seen()]
        assert _HELD.data_ptr() not in private and private[0] != private[1]


def test_a_colocated_role_offers_and_applies_without_register() -> None:
    """A role's plain ``weights``/``load_weights`` are reached as ``<role>_<name>`` on the colocated class."""
    roles = create_colocated_worker_cls({"trainer": _Holder, "sink": _Pointers})
    with WorkerGroup(roles, 1, backend="local") as wg, WorkerGroup(_Pointers, 1, backend="local") as dst:
        parts = wg.spawn(["trainer", "sink"])
        WeightSync(parts["trainer"], dst)(version=1)
        WeightSync(parts["trainer"], parts["sink"])(version=2)
        assert list(dst.seen()[0]) == ["t"] and list(parts["sink"].seen()[0]) == ["t"]


class _Lender(_Pointers):
    def __init__(self, shape: tuple[int, ...] = (3, 4)) -> None:
        super().__init__()
        self.param = torch.zeros(shape)

    def weight_buffers(self, shapes: dict[str, Any]) -> dict[str, torch.Tensor]:
        return {"t": self.param}

    @register(Dispatch.ONE_TO_ALL)
    def lent(self) -> tuple[int, torch.Tensor]:
        return self.param.data_ptr(), self.param.clone()


def test_lent_buffers_are_filled_in_place_and_applied_as_themselves() -> None:
    with WorkerGroup(_Holder, 1, backend="local") as src, WorkerGroup(_Lender, 2, backend="local") as dst:
        WeightSync(src, dst, bucket_bytes=20)(version=1)  # several buckets, boundaries inside the tensor
        for (pointer, value), seen in zip(dst.lent(), dst.seen(), strict=True):
            assert seen["t"] == pointer and torch.equal(value, _HELD)


def test_a_lent_buffer_of_the_wrong_shape_is_refused() -> None:
    with (
        WorkerGroup(_Holder, 1, backend="local") as src,
        WorkerGroup(_Lender, 1, backend="local", init_kwargs={"shape": (4, 3)}) as dst,
    ):
        with pytest.raises(Exception, match="weight_buffers lends 't'"):
            WeightSync(src, dst)(version=1)
        assert dst.lent()[0][1].count_nonzero() == 0


# -- in the trace, and how many calls ------------------------------------------------------------
def _slices(tracer: Any) -> list[tuple[str, str, dict[str, Any]]]:
    """Every slice as ``(track, name, args)``."""
    tracks = {e["tid"]: e["args"]["name"] for e in tracer.events if e["ph"] == "M" and e["name"] == "thread_name"}
    return [(tracks[e["tid"]], e["name"], e["args"]) for e in tracer.events if e["ph"] == "X"]


def test_a_transfer_shows_on_the_driver_and_per_bucket_on_the_ranks() -> None:
    with WorkerGroup(WeightTrainer, 2, backend="local") as src, WorkerGroup(WeightRollout, 2, backend="local") as dst:
        with trace() as tracer:
            report = WeightSync(src, dst, bucket_bytes=100)(version=3)
    slices = _slices(tracer)
    driver = [name for track, name, _ in slices if track == "driver" and name.startswith("WeightSync")]
    assert [n for n in driver if "->" in n] and {"WeightSync plan", "WeightSync buckets", "WeightSync commit"} <= set(
        driver
    )
    on_ranks: dict[str, set[tuple[str, int]]] = {}
    for track, _, args in slices:
        if " rank " in track and args.get("phase") in ("pack", "move", "apply"):
            on_ranks.setdefault(track.split("#")[0], set()).add((args["phase"], args["bucket"]))
    every = set(range(report.buckets))
    assert {b for phase, b in on_ranks["WeightTrainer"] if phase == "pack"} == every
    for phase in ("move", "apply"):
        assert {b for p, b in on_ranks["WeightRollout"] if p == phase} == every
    assert {p for p, _ in on_ranks["WeightTrainer"]} == {"pack"}


def test_the_report_gives_phase_times() -> None:
    with WorkerGroup(WeightTrainer, 2, backend="local") as src, WorkerGroup(WeightRollout, 2, backend="local") as dst:
        report = WeightSync(src, dst, bucket_bytes=100)(version=3)
    assert set(report.phases) == {"plan", "buckets", "commit", "pack", "move", "apply"}
    assert all(seconds >= 0 for seconds in report.phases.values())


def test_a_transfer_makes_four_calls_and_two_per_bucket() -> None:
    """layout, want, a pack and a move per bucket, commit, end: want asked again only when the shapes change."""
    with WorkerGroup(WeightTrainer, 2, backend="local") as src, WorkerGroup(WeightRollout, 2, backend="local") as dst:
        sync = WeightSync(src, dst, bucket_bytes=100)
        counts = []
        for step, dtype in ((0, None), (1, None), (1, torch.float16)):
            src.set_step(step)
            sync.dtype = dtype  # float16: other shapes, so the want asked beside the layout is asked again
            dst.configure()
            with trace() as tracer:
                report = sync(version=step)
            calls = [
                n for track, n, _ in _slices(tracer) if track == "driver" and n.endswith("<weight transfer> dispatch")
            ]
            counts.append(len(calls) - 2 * report.buckets)
        _check(dst, None, 1, step=1, dtype=torch.float16)
    assert counts == [4, 4, 5]


#: A tensor of 2.8 MiB: its buckets go rank to rank over the bridge, not inline in the steps' messages.
_LARGE = {**WEIGHT_SET, "big": ((700, 1024), "float32")}


@pytest.mark.usefixtures("ray_session")
def test_ray_buckets_over_a_mebibyte_go_rank_to_rank_and_arrive_exactly() -> None:
    with (
        WorkerGroup(WeightTrainer, 1, backend="ray", init_args=(_LARGE,)) as src,
        WorkerGroup(WeightRollout, 1, backend="ray") as dst,
    ):
        before = driver_traffic()
        report = WeightSync(src, dst)(version=3)
        assert report.transport == "ray" and report.driver_bytes == 0
        assert (driver_traffic() - before).total == 0  # no byte through the driver (inline buckets would be)
        _a_stranger_is_refused_by(src.set_step(0)[0])
        for got, version, _ in dst.state():
            assert version == 3
            for name, full in make_weights(_LARGE).items():
                assert got[name].dtype == full.dtype and torch.equal(got[name], full), name


def _a_stranger_is_refused_by(pid: int) -> None:
    """Another user knocks on every port the source actor's process listens on at loopback (its bridge door)."""
    verdicts = knock_as_another_user(pid, loopback_only=True)
    assert "admitted" not in verdicts.values(), verdicts
    assert "refused" in verdicts.values(), f"the source's bridge door should greet and refuse: {verdicts}"


def test_a_plan_is_made_again_only_when_what_it_is_made_of_changes() -> None:
    with WorkerGroup(WeightTrainer, 2, backend="local") as src, WorkerGroup(WeightRollout, 2, backend="local") as dst:
        sync = WeightSync(src, dst, bucket_bytes=100)
        sync(version=1)
        first = sync.last_plan
        dst.configure()
        sync(version=2)
        assert sync.last_plan is first  # the same layout, names and wants
        dst.configure(cut=1)
        sync(version=3)
        assert sync.last_plan is not first
        _check(dst, 1, 3)
