"""The testing kit users get: strategies, the dispatch-mode checker, the fault-injecting backend, the fixtures."""

from __future__ import annotations

import importlib.metadata
import pickle
import threading
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, Phase, find, given, settings
from hypothesis import strategies as st

from dispatchcore import (
    PADDING_ROWS_KEY,
    BatchSizeError,
    DataProto,
    Dispatch,
    DispatchError,
    DispatchSpec,
    DispatchTimeoutError,
    Worker,
    WorkerDiedError,
    WorkerError,
    WorkerGroup,
    available_backends,
    chunk_with_padding,
    concat_outputs,
    current_call,
    register,
    trim_padding,
    unpad_dataproto,
)
from dispatchcore.testing import (
    ALL_DTYPES,
    Fault,
    FaultyExecutor,
    ModePropertyError,
    assert_dataproto_equal,
    check_dispatch_mode,
    dataprotos,
    nd_meshes,
    world_sizes,
)
from dispatchcore.testing.conformance import ExecutorConformance
from dispatchcore.testing.workers import EchoWorker
from dispatchcore.wire import dumps, loads

FAST = settings(deadline=None, max_examples=30, suppress_health_check=[HealthCheck.too_slow])


# -- strategies -------------------------------------------------------------------------------------


@FAST
@given(dataprotos(max_len=24, dtypes=ALL_DTYPES, with_tensors=None, auto_padding=None), world_sizes(1, 6))
def test_every_dtype_and_column_kind_survives_chunk_concat_and_the_wire(data: DataProto, n: int) -> None:
    assert_dataproto_equal(loads(dumps(data)), data)
    assert_dataproto_equal(pickle.loads(pickle.dumps(data)), data)
    if data.is_padding_enabled() or len(data) % n == 0:
        chunks, pad = chunk_with_padding(data, n)
        joined = DataProto.concat([loads(dumps(c)) for c in chunks])
        assert_dataproto_equal(unpad_dataproto(joined, pad), data, ignore_meta_keys=(PADDING_ROWS_KEY,))


def _kinds(data: DataProto) -> set[str]:
    kinds = set()
    for column in data.non_tensor_batch.values():
        if column.dtype != object:
            kinds.add("numeric")
        for value in column:
            kinds.add(type(value).__name__)
    return kinds


@pytest.mark.parametrize(
    "wanted",
    [
        pytest.param(lambda d: len(d) == 0, id="empty batch"),
        pytest.param(lambda d: d.batch is None, id="no tensors"),
        pytest.param(lambda d: "list" in _kinds(d), id="ragged lists"),
        pytest.param(lambda d: "ndarray" in _kinds(d), id="ragged arrays"),
        pytest.param(lambda d: {"NoneType", "dict"} <= _kinds(d), id="mixed objects"),
        pytest.param(lambda d: "numeric" in _kinds(d), id="numeric non-tensor column"),
        pytest.param(lambda d: any(0 in t.shape[1:] for t in (d.batch.values() if d.batch else ())), id="empty dim"),
        pytest.param(lambda d: any(isinstance(v, dict) for v in d.meta_info.values()), id="nested meta"),
        pytest.param(lambda d: d.is_padding_enabled() and len(d) % 7 != 0, id="padded odd length"),
    ],
)
def test_dataprotos_reach_the_corners(wanted: Any) -> None:
    strategy = dataprotos(max_len=24, with_tensors=None, auto_padding=None, max_non_tensor_keys=3)
    # Generation only: shrinking to the smallest such batch is not the point and costs minutes.
    assert wanted(find(strategy, wanted, settings=settings(max_examples=2000, database=None, phases=[Phase.generate])))


@FAST
@given(st.data(), world_sizes(1, 12))
def test_nd_meshes_give_one_collector_per_dp_rank(draw: st.DataObject, n: int) -> None:
    layout = draw.draw(nd_meshes("dp", n))["dp"]
    dps = {dp for dp, _ in layout}
    assert len(layout) == n and n % len(dps) == 0 and dps == set(range(len(dps)))
    assert sorted(dp for dp, collects in layout if collects) == sorted(dps)


def test_strategies_refuse_bad_bounds() -> None:
    with pytest.raises(ValueError, match="min_size"):
        world_sizes(0)
    with pytest.raises(ValueError, match="kinds"):
        find(dataprotos(non_tensor_kinds=("nope",), with_non_tensors=True), lambda d: True)


# -- the dispatch-mode checker ------------------------------------------------------------------------


def dispatch_strided(wg: Any, data: DataProto) -> tuple[tuple[list[Any]], dict[str, list[Any]]]:
    """Rank r gets rows r, r+n, r+2n, ... (padded by repeating rows, declared as padding)."""
    n = wg.world_size
    length = len(data)
    pad = (-length) % n
    if pad and not data.is_padding_enabled():
        raise BatchSizeError(f"cannot deal {length} rows to {n} ranks without auto_padding")
    rows = np.concatenate([np.arange(length), np.arange(pad) % max(length, 1)]) if length else np.arange(0)
    chunks = []
    for r in range(n):
        mine = rows[r::n]
        chunk = data.select_idxs(mine) if len(mine) else data[0:0]
        chunk.meta_info[PADDING_ROWS_KEY] = int(sum(1 for i in range(r, len(rows), n) if i >= length))
        chunks.append(chunk)
    current_call().extra["strided_rows"] = length
    return (chunks,), {}


def collect_strided(wg: Any, outputs: list[DataProto]) -> DataProto:
    n = len(outputs)
    real = [o[: len(o) - o.meta_info.get(PADDING_ROWS_KEY, 0)] for o in outputs]
    joined = concat_outputs(real)
    joined.meta_info.pop(PADDING_ROWS_KEY, None)
    # joined holds rank 0's rows, then rank 1's ...; row i of the input sits at rank i % n, place i // n.
    offsets = np.cumsum([0] + [len(c) for c in real[:-1]])
    order = [offsets[i % n] + i // n for i in range(current_call().extra["strided_rows"])]
    return joined.select_idxs(np.array(order, dtype=np.int64))


def dispatch_contiguous(wg: Any, data: DataProto) -> Any:
    """Chunk i to rank i, as DP_COMPUTE_PROTO does, written with public names."""
    chunks, pad = chunk_with_padding(data, wg.world_size)
    ctx = current_call()
    ctx.pad_size, ctx.padded_len = pad, len(data) + pad
    return (chunks,), {}


def _builtin_collect(wg: Any, outputs: list[Any]) -> Any:
    joined = concat_outputs(outputs)
    joined.meta_info.pop(PADDING_ROWS_KEY, None)
    ctx = current_call()
    return trim_padding(joined, ctx.pad_size, ctx.padded_len)


@pytest.mark.parametrize(
    ("dispatch_fn", "collect_fn"), [(dispatch_strided, collect_strided), (dispatch_contiguous, _builtin_collect)]
)
def test_checker_passes_correct_custom_modes(dispatch_fn: Any, collect_fn: Any) -> None:
    check_dispatch_mode(DispatchSpec(dispatch_fn, collect_fn, name="MINE"), max_examples=60)


def test_checker_passes_the_built_in_nd_mode_on_any_layout() -> None:
    from dispatchcore import make_nd_compute_dataproto_dispatch_fn

    check_dispatch_mode(make_nd_compute_dataproto_dispatch_fn("dp"), meshes=lambda n: nd_meshes("dp", n))


def _reversed_collect(wg: Any, outputs: list[Any]) -> Any:
    return _builtin_collect(wg, outputs[::-1])


def _untrimmed_collect(wg: Any, outputs: list[Any]) -> Any:
    joined = concat_outputs(outputs)
    joined.meta_info.pop(PADDING_ROWS_KEY, None)
    return joined


def _floor_dispatch(wg: Any, data: DataProto) -> Any:
    size = len(data) // wg.world_size
    return ([data[r * size : (r + 1) * size] for r in range(wg.world_size)],), {}


def _undeclared_padding_dispatch(wg: Any, data: DataProto) -> Any:
    (chunks,), kwargs = dispatch_strided(wg, data)
    for chunk in chunks:
        chunk.meta_info.pop(PADDING_ROWS_KEY, None)
    return (chunks,), kwargs


def _mutating_dispatch(wg: Any, data: DataProto) -> Any:
    data.meta_info["seen"] = True
    return dispatch_strided(wg, data)


@pytest.mark.parametrize(
    ("dispatch_fn", "collect_fn", "broken", "says"),
    [
        pytest.param(dispatch_contiguous, _reversed_collect, "order", "input order", id="wrong order"),
        pytest.param(dispatch_contiguous, _untrimmed_collect, "padding", "not removed", id="padding rows kept"),
        pytest.param(_floor_dispatch, _builtin_collect, "dropped_rows", "reach no rank", id="dropped rows"),
        pytest.param(_undeclared_padding_dispatch, collect_strided, "padding", "counted in", id="padding undeclared"),
        pytest.param(_mutating_dispatch, collect_strided, "caller_unchanged", "meta_info", id="mutates the caller"),
    ],
)
def test_checker_names_the_broken_property_world_size_and_batch(
    dispatch_fn: Any, collect_fn: Any, broken: str, says: str
) -> None:
    mode = DispatchSpec(dispatch_fn, collect_fn, name="BROKEN")
    with pytest.raises(ModePropertyError) as info:
        check_dispatch_mode(mode, max_examples=200)
    err = info.value
    assert isinstance(err, AssertionError)
    assert err.property == broken, str(err)
    assert f"breaks {broken!r} at world_size={err.world_size} on a batch of {len(err.batch)} rows" in str(err)
    assert says in str(err) and "'BROKEN'" in str(err)


def test_checker_holds_per_rank_modes_to_rank_order() -> None:
    from dispatchcore import Dispatch, direct_call

    dispatch_dp_compute_proto = direct_call(Dispatch.DP_COMPUTE_PROTO, 1).spec.dispatch_fn  # the mode's own
    check_dispatch_mode(Dispatch.DP_COMPUTE_METRIC, collects="per_rank", max_examples=30)
    shuffled = DispatchSpec(dispatch_dp_compute_proto, lambda wg, outs: outs[1:] + outs[:1], name="ROTATED")
    with pytest.raises(ModePropertyError, match="position 0 of the collected list holds rank 1's output") as info:
        check_dispatch_mode(shuffled, collects="per_rank", world_sizes=st.integers(2, 4), max_examples=30)
    assert info.value.property == "order"


def test_checker_reports_a_dispatch_that_raises() -> None:
    def refuses(wg: Any, data: DataProto) -> Any:
        raise KeyError("no such column")

    with pytest.raises(ModePropertyError, match="dispatch raised KeyError") as info:
        check_dispatch_mode(DispatchSpec(refuses, _builtin_collect, name="RAISES"), max_examples=5)
    assert info.value.property == "dispatch"


# -- the fault-injecting backend ---------------------------------------------------------------------


class TestFaultyWrapsLocalConformance(ExecutorConformance):
    """With no fault planted the wrapper is indistinguishable from its inner backend."""

    backend = "faulty"
    backend_options = {"inner": "local"}
    ranks_are_processes = False


def test_faulty_backend_is_registered_by_entry_point() -> None:
    points = {ep.name: ep.value for ep in importlib.metadata.entry_points(group="dispatchcore")}
    assert points.get("faulty") == "dispatchcore.testing.faults"
    assert "faulty" in available_backends()


def faulty(*faults: Fault, n: int = 4, **kwargs: Any) -> WorkerGroup[Any]:
    return WorkerGroup(EchoWorker, n, backend="faulty", inner="local", faults=list(faults), **kwargs)


def test_raise_on_the_kth_call_names_rank_method_and_keeps_the_group() -> None:
    with faulty(Fault.raise_on(rank=2, method="info", call=2)) as wg:
        assert len(wg.info()) == 4  # call 1 passes
        with pytest.raises(WorkerError) as info:
            wg.info()
        err = info.value
        assert (err.rank, err.method, err.exc_type) == (2, "info", "InjectedFault")
        assert "injected fault: rank 2 raised on call 2 of 'info'" in str(err)
        assert "Traceback" in err.remote_traceback
        assert [i["rank"] for i in wg.info()] == [0, 1, 2, 3], "a raising rank leaves the group usable"
        executor = FaultyExecutor.of(wg)
        assert [(f.fault.kind, f.call) for f in executor.fired] == [("raise", 2)]
        assert executor.calls("info", rank=2) == 3


def test_raise_a_chosen_exception_on_every_call() -> None:
    with faulty(Fault.raise_on(rank=0, method="echo", call=None, error=MemoryError("CUDA out of memory"))) as wg:
        for _ in range(2):
            with pytest.raises(WorkerError, match="MemoryError: CUDA out of memory") as info:
                wg.echo(DataProto.from_dict({"x": torch.arange(8)}))
            assert info.value.rank == 0


def test_injected_and_real_failures_report_the_lowest_rank() -> None:
    with faulty(Fault.raise_on(rank=2, method="fail_on")) as wg:
        with pytest.raises(WorkerError) as info:
            wg.fail_on(1)  # rank 1 really raises
        assert info.value.rank == 1 and "planted failure" in info.value.remote_traceback
        with faulty(Fault.raise_on(rank=0, method="fail_on")) as other, pytest.raises(WorkerError) as info:
            other.fail_on(1)
        assert info.value.exc_type == "InjectedFault" and info.value.rank == 0


def test_die_is_a_worker_death_and_breaks_the_group() -> None:
    wg = faulty(Fault.die(rank=1, method="echo", call=2))
    data = DataProto.from_dict({"x": torch.arange(8)})
    assert wg.echo(data).batch["x"].tolist() == list(range(8))
    with pytest.raises(WorkerDiedError) as info:
        wg.echo(data)
    assert (info.value.rank, info.value.method) == (1, "echo")
    assert "injected fault" in str(info.value) and "nothing was killed" in str(info.value)
    with pytest.raises(DispatchError, match="rank 1 died"):
        wg.info()
    wg.shutdown()
    wg.shutdown()


@pytest.mark.timeout(60)  # the hung rank never answers: only the call's timeout ends the call
def test_hang_honours_the_call_timeout() -> None:
    with faulty(Fault.hang(rank=3, method="info"), call_timeout=0.3) as wg:
        with pytest.raises(DispatchTimeoutError, match=r"rank\(s\) \[3\]"):
            wg.info()
        with pytest.raises(DispatchError, match="can take no more calls"):
            wg.info()


@pytest.mark.timeout(60)  # without a call timeout only shutdown() can end the call
def test_hang_is_released_by_shutdown() -> None:
    wg = faulty(Fault.hang(rank=0, method="info"))
    outcome: list[BaseException] = []
    caller = threading.Thread(target=lambda: outcome.append(_raised(wg.info)), daemon=True)
    caller.start()
    caller.join(0.3)
    assert caller.is_alive(), "the hung call returned on its own"
    wg.shutdown()
    caller.join()
    assert isinstance(outcome[0], WorkerDiedError) and outcome[0].rank == 0
    assert "shut down" in str(outcome[0])


def _raised(fn: Any) -> BaseException | None:
    try:
        fn()
    except BaseException as exc:  # noqa: BLE001
        return exc
    return None


@pytest.mark.timeout(60)  # a 600 s slow rank: only a prompt timeout lets this pass
def test_slow_rank_delays_its_answer() -> None:
    with faulty(Fault.slow(rank=1, method="sleep_then_rank", seconds=600, call=1)) as wg:
        future = wg.sleep_then_rank(0)
        assert not future.done()
        with pytest.raises(DispatchTimeoutError, match=r"rank\(s\) \[1\]"):
            future.get(timeout=0.2)
    with faulty(Fault.slow(rank=1, method="sleep_then_rank", seconds=0.05, call=None)) as wg:
        assert wg.sleep_then_rank(0).get() == [0, 1, 2, 3]
        assert wg.sleep_then_rank(0).get() == [0, 1, 2, 3]


@pytest.mark.parametrize(
    ("fault", "error", "match"),
    [
        (Fault.raise_on(rank=9, method="info"), ValueError, "outside this group of 4 ranks"),
        (Fault.die(rank=0, method="inf"), ValueError, r"did you mean \['info'\]"),
        ("die", TypeError, "Fault objects"),
    ],
)
def test_bad_faults_are_refused_with_the_fix(fault: Any, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        faulty(fault)


def test_fault_and_option_misuse_is_refused() -> None:
    with pytest.raises(ValueError, match="seconds > 0"):
        Fault.slow(rank=0, method="info", seconds=0)
    with pytest.raises(ValueError, match="k-th call"):
        Fault.die(rank=0, method="info", call=0)
    with pytest.raises(ValueError, match="same call"):
        faulty(Fault.die(rank=0, method="info", call=2), Fault.hang(rank=0, method="info", call=None))
    with pytest.raises(ValueError, match="inner='local'"):
        WorkerGroup(EchoWorker, 2, backend="faulty", inner="faulty")
    with pytest.raises(TypeError, match="unknown option"):
        WorkerGroup(EchoWorker, 2, backend="faulty", fault=[])
    with WorkerGroup(EchoWorker, 2) as plain, pytest.raises(TypeError, match="not 'faulty'"):
        FaultyExecutor.of(plain)


def test_faults_planted_later_count_calls_from_the_start() -> None:
    with faulty() as wg:
        wg.info()
        executor = FaultyExecutor.of(wg)
        executor.plant(Fault.raise_on(rank=1, method="info", call=executor.calls("info", rank=1) + 1))
        with pytest.raises(WorkerError):
            wg.info()
        assert len(wg.info()) == 4


def test_make_group_wraps_the_runs_backend_when_given_faults(make_group: Any, dispatchcore_backend: str) -> None:
    wg = make_group(EchoWorker, 2, faults=[Fault.raise_on(rank=1, method="info")])
    assert wg.backend == "faulty" and FaultyExecutor.of(wg).inner_backend == dispatchcore_backend
    with pytest.raises(WorkerError):
        wg.info()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_faults_on_a_process_backend() -> None:
    """The wrapper on real processes: injected failures, then a real death seen through it (one group: ~10 s)."""
    if "multiprocess" not in available_backends():
        pytest.skip("the example multiprocess executor is not installed")
    kw = {"backend": "faulty", "inner": "multiprocess", "death_timeout": 10}
    with WorkerGroup(EchoWorker, 2, faults=[Fault.raise_on(rank=1, method="echo")], **kw) as wg:
        data = DataProto.from_dict({"x": torch.arange(6)})
        with pytest.raises(WorkerError, match="InjectedFault"):
            wg.echo(data)
        assert wg.echo(data).batch["x"].tolist() == list(range(6))
        with pytest.raises(WorkerDiedError) as info:
            wg.exit_on(1)  # a real exit of rank 1's process
        assert info.value.rank == 1
        with pytest.raises(DispatchError, match="rank 1 died"):
            wg.info()


def test_kit_and_example_use_only_public_names() -> None:
    """The fault executor, the checker, the strategies and the example import nothing private."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    kit = root / "src" / "dispatchcore" / "testing"
    files = [kit / "faults.py", kit / "modes.py", kit / "strategies.py"]
    files += sorted((root / "examples" / "testing_your_workers").rglob("*.py"))
    private = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else []
            names += [a.name for a in node.names] if isinstance(node, ast.Import) else []
            private += [f"{path.relative_to(root)}: {n}" for n in names if n.startswith("dispatchcore._")]
    assert not private, private


class _Recovering(Worker):
    def __init__(self) -> None:
        self.configured: list[str] = []

    @register(Dispatch.ONE_TO_ALL, setup=True)
    def configure(self, value: str) -> None:
        self.configured.append(value)

    @register(Dispatch.ONE_TO_ALL, retry=True)
    def step(self) -> int:
        return self.rank


def test_injected_death_exercises_the_replace_policy_on_threads() -> None:
    """Fault.die on local + on_rank_death="replace": the driver's recovery path runs without processes."""
    from dispatchcore.testing.faults import Fault, FaultyExecutor

    with WorkerGroup(
        _Recovering, 2, backend="faulty", inner="local", on_rank_death="replace", faults=[Fault.die(1, "step")]
    ) as wg:
        wg.configure("cfg")
        assert wg.step() == [0, 1]  # rank 1 "died", was replaced, the step was retried
        assert [f.fault.kind for f in FaultyExecutor.of(wg).fired] == ["die"]
        assert wg.step() == [0, 1]
