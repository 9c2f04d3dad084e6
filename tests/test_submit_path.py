"""Every call the core makes goes one way (the group's submit path): traced, stragglers settled, one wording.

Registered methods, calls by name (``execute_all``), the rejoin after a
replacement, the row ledger's reads and frees and weight-transfer steps all
reach the executor through it.  These cases show it from outside for the
calls that used to take a way of their own, and that the rows the driver
let go of ride the next call instead of separate free calls.
"""

from __future__ import annotations

import gc
import time
from typing import Any

import pytest

from dispatchcore import (
    Dispatch,
    DispatchError,
    WeightSync,
    Worker,
    WorkerError,
    WorkerGroup,
    available_backends,
    register,
    trace,
)
from dispatchcore.executor import Call, CallHandle, holds_kept_rows, register_executor
from dispatchcore.testing import MockExecutor
from dispatchcore.testing.conformance import batch
from dispatchcore.testing.weight_workers import WeightRollout, WeightTrainer
from dispatchcore.testing.workers import EchoWorker

IN_PROCESS = ["local", "mock"]


def _rank_slices(tracer: Any, label: str) -> list[str]:
    """Names of the compute slices on the rank tracks of the group ``label`` (``EchoWorker#3``)."""
    tracks = {e["tid"]: e["args"]["name"] for e in tracer.events if e["ph"] == "M" and e["name"] == "thread_name"}
    return [
        e["name"]
        for e in tracer.events
        if e["ph"] == "X" and tracks[e["tid"]].startswith(f"{label} rank ") and e["args"]["phase"] == "compute"
    ]


def _label(tracer: Any, worker: str) -> list[str]:
    """The trace labels of the groups of ``worker`` that have rank tracks."""
    names = {e["args"]["name"] for e in tracer.events if e["ph"] == "M" and e["name"] == "thread_name"}
    return sorted({n.rsplit(" rank ", 1)[0] for n in names if n.startswith(f"{worker}#") and " rank " in n})


@pytest.mark.parametrize("backend", IN_PROCESS)
def test_a_call_by_name_is_traced_and_its_values_unwrapped(backend: str) -> None:
    with WorkerGroup(EchoWorker, 2, backend=backend) as wg:
        with trace() as tracer:
            answers = wg.execute_all("all_to_all", 7)
        assert [(rank, args) for rank, args, _ in answers] == [(0, (7,)), (1, (7,))]
    (label,) = _label(tracer, "EchoWorker")
    assert _rank_slices(tracer, label) == ["all_to_all", "all_to_all"]
    driver = [e["name"] for e in tracer.events if e["ph"] == "X" and e["tid"] == 0]
    assert driver == ["all_to_all dispatch", "all_to_all execute"]


@pytest.mark.parametrize("backend", IN_PROCESS)
def test_weight_transfer_steps_are_traced_on_both_groups(backend: str) -> None:
    with (
        WorkerGroup(WeightTrainer, 2, backend=backend) as src,
        WorkerGroup(WeightRollout, 2, backend=backend) as dst,
    ):
        with trace() as tracer:
            WeightSync(src, dst, bucket_bytes=100)(version=1)
        assert [version for _, version, _ in dst.state()] == [1, 1]
    (trainer,) = _label(tracer, "WeightTrainer")
    (rollout,) = _label(tracer, "WeightRollout")
    for label in (trainer, rollout):
        steps = _rank_slices(tracer, label)
        assert steps and all("transfer" in name for name in steps), steps


class _Refusing(MockExecutor):
    """The mock backend, whose ``submit`` fails like a backend's own transport when told to."""

    name = "refusing-mock"

    def submit(self, call: Call) -> CallHandle:
        if getattr(self, "refuse", False):
            raise RuntimeError("no route to the ranks")
        return super().submit(call)


def test_a_backend_refusal_reads_the_same_for_every_kind_of_call() -> None:
    register_executor(_Refusing)  # here, not at import: a plugin test may have reloaded the registry since
    wording = "backend 'refusing-mock' could not send the arguments of call"
    with (
        WorkerGroup(WeightTrainer, 2, backend="refusing-mock") as src,
        WorkerGroup(WeightRollout, 2, backend="refusing-mock") as dst,
    ):
        src.executor.refuse = True  # type: ignore[attr-defined]
        with pytest.raises(DispatchError, match=wording):
            src.set_step(1)  # a registered method
        with pytest.raises(DispatchError, match=wording):
            src.execute_all("set_step", 1)  # a call by name
        with pytest.raises(DispatchError, match=wording) as step:
            WeightSync(src, dst)(version=1)  # a transfer step
        assert "weight transfer step on the source group" in "\n".join(step.value.__notes__)
        src.executor.refuse = False  # type: ignore[attr-defined]
        src.set_step(2)  # nothing was sent: the group is usable


class _Holds(Worker):
    @register(Dispatch.ONE_TO_ALL)
    def raise_or_hold(self, seconds: float) -> int:
        """Rank 0 raises at once; the others sit in C code (a sleep no interrupt reaches) for ``seconds``."""
        if self.rank == 0:
            raise ValueError("rank 0 fails fast")
        time.sleep(seconds)
        return self.rank

    @register(Dispatch.ONE_TO_ALL)
    def rank_of(self) -> int:
        return self.rank


def test_a_call_by_name_settles_stragglers_instead_of_queueing_behind_them() -> None:
    with WorkerGroup(_Holds, 2, backend="local", cancel_grace=0.5) as wg:
        with pytest.raises(WorkerError, match="fails fast"):
            wg.raise_or_hold(20.0)  # rank 1 is left sleeping: a straggler
        with pytest.raises(DispatchError, match=r"rank\(s\) \[1\] are still running 'raise_or_hold'"):
            wg.execute_all("rank_of")  # refused after cancel_grace, not queued for 20 s


def _process_backend(name: str) -> str:
    if name not in available_backends():
        pytest.skip(f"{name} backend unavailable")
    return name


#: Backends whose ranks keep rows in processes of their own (torchrun's rank 0 lives in the driver).
PROCESSES = ["multiprocess", "torchrun"]


@pytest.mark.parametrize("backend", PROCESSES)
def test_a_lazy_row_read_is_traced_on_a_process_backend(backend: str) -> None:
    with WorkerGroup(EchoWorker, 2, backend=_process_backend(backend)) as wg:
        lazy = wg.echo.options(lazy=True)(batch(4))
        remote = [s.rank for s in lazy.remote_sources() if not holds_kept_rows(s.held.key)]
        with trace() as tracer:
            assert lazy.batch["x"].tolist() == list(range(4))
    driver = [e["name"] for e in tracer.events if e["ph"] == "X" and e["tid"] == 0]
    assert remote and driver.count("<kept rows> execute") == len(remote), driver


@pytest.mark.parametrize("backend", PROCESSES)
def test_frees_ride_the_next_call_on_a_process_backend(backend: str) -> None:
    with WorkerGroup(EchoWorker, 2, backend=_process_backend(backend)) as wg:
        baseline = wg.kept_row_keys()
        lazy = wg.echo.options(lazy=True)(batch(4))
        assert [k - b for k, b in zip(wg.kept_row_keys(), baseline, strict=True)] == [1, 1]
        remote = sorted(s.held.key for s in lazy.remote_sources() if not holds_kept_rows(s.held.key))
        sent: list[Call] = []
        submit = wg.executor.submit
        wg.executor.submit = lambda call: sent.append(call) or submit(call)  # type: ignore[method-assign]
        del lazy
        gc.collect()
        assert wg.kept_row_keys() == baseline  # freed before the method counted
        (counted,) = sent  # one call: no free calls of their own
        assert counted.method == "kept_row_keys" and sorted(counted.instructions.free) == remote


@pytest.mark.parametrize("backend", PROCESSES)
def test_frees_left_when_no_call_follows_go_at_shutdown(backend: str) -> None:
    wg = WorkerGroup(EchoWorker, 2, backend=_process_backend(backend))
    try:
        lazy = wg.echo.options(lazy=True)(batch(4))
        remote = {s.rank: s.held.key for s in lazy.remote_sources() if not holds_kept_rows(s.held.key)}
        sent: list[Call] = []
        submit = wg.executor.submit
        wg.executor.submit = lambda call: sent.append(call) or submit(call)  # type: ignore[method-assign]
        del lazy
        gc.collect()
    finally:
        wg.shutdown()
    assert remote and all(call.beside for call in sent)
    assert {call.ranks[0]: call.args[0][0].free for call in sent} == {r: (k,) for r, k in remote.items()}
