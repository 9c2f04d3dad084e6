"""Groups that grow and shrink between calls (``wg.grow`` / ``wg.shrink``) on local, self-started torchrun and Ray.

A rollout group goes 2 -> 4 -> 3 between steps of a training loop; after each
resize a DP call gives what a fresh group of the new size gives (a fresh local
group: the workers are deterministic, and every backend gives the same values),
the new ranks hold the trainer's weights byte for byte before their first call,
and nothing the removed ranks had is left behind.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from dispatchcore import (
    DataProto,
    Dispatch,
    DispatchError,
    GroupResized,
    WeightSync,
    Worker,
    WorkerGroup,
    collective,
    create_colocated_worker_cls,
    driver_traffic,
    make_nd_compute_dataproto_dispatch_fn,
    register,
    trace,
)
from dispatchcore.testing.weight_workers import WeightTrainer, make_weights

pytestmark = pytest.mark.timeout(240)

#: Backend name and its options: torchrun self-started ranks grow onto spare processes.
BACKENDS = {"local": {}, "torchrun": {"spare_ranks": 2}, "ray": {}}


class Rollout(Worker):
    """Deterministic: each output row depends on its input, the weights, this rank and the world size."""

    def __init__(self) -> None:
        self.held: dict[str, torch.Tensor] = {}
        self.seed = -1
        self.changes: list[tuple[int, int, tuple[int, ...], tuple[int, ...]]] = []
        self.calls = 0

    @register(Dispatch.ONE_TO_ALL, setup=True)
    def setup(self, seed: int) -> None:
        self.seed = seed

    def load_weights(self, weights: list[tuple[str, torch.Tensor]]) -> None:
        for name, t in weights:
            self.held[name] = t.clone()

    def weights(self) -> dict[str, torch.Tensor]:
        return dict(self.held)

    def on_membership_change(self, change: Any) -> None:
        self.changes.append((change.previous_world_size, change.world_size, change.added, change.removed))

    @register(Dispatch.DP_COMPUTE_PROTO)
    def generate(self, data: DataProto) -> DataProto:
        self.calls += 1
        time.sleep(data.meta_info.get("sleep", 0))
        total = sum(float(t.double().sum()) for t in self.held.values() if t.is_floating_point())
        x = data.batch["x"].double()
        y = x * 3 + total + self.seed + self.rank * 1000 + self.world_size * 100000
        return DataProto.from_dict({"y": y})

    @register(Dispatch.ONE_TO_ALL)
    def state(self) -> tuple[dict[str, torch.Tensor], int, int, int, list[Any]]:
        """What each rank holds, before counting as a generate call."""
        return self.held, self.rank, self.world_size, self.calls, self.changes

    @register(Dispatch.ONE_TO_ALL)
    def reduce(self) -> float:
        """A ``dispatchcore.collective`` sum over the ranks: its communicator follows the size."""
        return float(collective.all_reduce(torch.ones(1))[0])


def _start(backend: str, request: pytest.FixtureRequest) -> tuple[WorkerGroup[Any], WorkerGroup[Rollout]]:
    """A one-rank trainer and a two-rank rollout group on ``backend``."""
    if backend == "ray":
        pytest.importorskip("ray")
        request.getfixturevalue("ray_session")
    trainer = WorkerGroup(WeightTrainer, 1, backend=backend, init_kwargs={"sharded": False})
    try:
        return trainer, WorkerGroup(Rollout, 2, backend=backend, **BACKENDS[backend])
    except BaseException:
        trainer.shutdown()
        raise


def _fresh(size: int, trainer_step: int | None, batch: DataProto) -> DataProto:
    """What a fresh group of ``size`` ranks gives after setup and the trainer's weights of ``trainer_step``."""
    with WorkerGroup(Rollout, size) as fresh, WorkerGroup(WeightTrainer, 1, init_kwargs={"sharded": False}) as t:
        fresh.setup(7)
        if trainer_step is not None:
            t.set_step(trainer_step)
            WeightSync(t, fresh)(trainer_step)
        return fresh.generate(batch)


def _assert_current(rollout: WorkerGroup[Rollout], step: int, ranks: range) -> None:
    """Ranks ``ranks`` hold the trainer's weights of ``step``, byte for byte, and have run no generate call."""
    want = make_weights(step=step)
    for held, rank, _, calls, _ in (rollout.state()[r] for r in ranks):
        assert calls == 0, f"rank {rank} ran a call before it had the weights"
        assert sorted(held) == sorted(want)
        for name, t in want.items():
            assert held[name].dtype == t.dtype and held[name].shape == t.shape
            assert held[name].reshape(-1).view(torch.uint8).equal(t.reshape(-1).view(torch.uint8)), name


def _alive(backend: str, wg: WorkerGroup[Any], removed: Any = None) -> int:
    """How many rank threads, processes or actors of ``wg`` run (Ray: the group's, plus ``removed`` if it does)."""
    executor: Any = wg.executor
    if backend == "local":
        prefix = f"dispatchcore-{executor.spec.name}-rank"
        return sum(t.name.startswith(prefix) and t.is_alive() for t in threading.enumerate())
    if backend == "torchrun":
        world = executor._world
        return sum(proc.poll() is None for d, proc in world.processes.items() if d not in world.spares)
    import ray

    try:
        ray.get(removed.describe.remote(), timeout=30)
    except Exception:  # noqa: BLE001 - the actor is gone, as it should be
        return wg.world_size
    return wg.world_size + 1


@pytest.mark.parametrize(
    "backend", [pytest.param(b, marks=[pytest.mark.slow] if b != "local" else []) for b in BACKENDS]
)
def test_rollout_grows_and_shrinks_between_training_steps(backend: str, request: pytest.FixtureRequest) -> None:
    batch = DataProto.from_dict({"x": torch.arange(13)}, auto_padding=True)
    trainer, rollout = _start(backend, request)
    try:
        rollout.setup(7)
        sync = WeightSync(trainer, rollout)
        view = rollout[1:]
        for step in (1, 2, 3):
            trainer.set_step(step)
            sync(step)
            if step == 2:  # grow 2 -> 4: the new ranks get setup, then this step's weights, before any call
                change = rollout.grow(2, sync=sync, version=step)
                assert isinstance(change, GroupResized) and change.added == (2, 3) and change.world_size == 4
                _assert_current(rollout, step, range(2, 4))
                assert view.state()[0][1:3] == (1, 4)  # a view follows its rank into the new world
            if step == 3:  # shrink 4 -> 3 by a middle rank: the ranks above move down
                removed = rollout.executor.actor(1) if backend == "ray" else None  # type: ignore[attr-defined]
                change = rollout.shrink(1)
                assert change.removed == (1,) and change.world_size == 3
                with pytest.raises(DispatchError, match=r"names rank\(s\) \[1\], which shrink removed"):
                    view.state()
                assert _alive(backend, rollout, removed) == 3
            out = rollout.generate(batch)
            size = rollout.world_size
            assert out.batch["y"].equal(_fresh(size, step, batch).batch["y"]), f"step {step} on {size} ranks"
            states = rollout.state()
            assert [(s[1], s[2]) for s in states] == [(r, size) for r in range(size)]
            assert rollout.reduce() == [float(size)] * size
        # The hook ran on every rank, the new ones included, with the old and new sizes.
        assert [s[4] for s in states] == [[(2, 4, (2, 3), ()), (4, 3, (), (1,))]] * 3
    finally:
        rollout.shutdown()
        trainer.shutdown()
    if backend != "ray":
        assert _alive(backend, rollout) == 0


class Relay(Rollout):
    """Says which rank was handed which rows: lazy rows moved rank to rank land where the split says."""

    @register(Dispatch.DP_COMPUTE_PROTO)
    def relay(self, data: DataProto) -> DataProto:
        return DataProto.from_dict({"y": data.batch["y"], "at": torch.full((len(data),), self.rank)})


def _gone(pid: int) -> bool:
    return not os.path.exists(f"/proc/{pid}")


@pytest.mark.slow
def test_self_started_torchrun_without_spares_grows_by_starting_processes() -> None:
    """No spares: a grow starts processes, which join the row transport rebuilt over every process at the new size."""
    batch = DataProto.from_dict({"x": torch.arange(8)}, auto_padding=True)
    trainer = WorkerGroup(WeightTrainer, 1, backend="torchrun", init_kwargs={"sharded": False})
    rollout = WorkerGroup(Relay, 2, backend="torchrun")
    processes: dict[int, Any] = rollout.executor._world.processes  # type: ignore[attr-defined]
    try:
        rollout.setup(7)
        sync = WeightSync(trainer, rollout)
        trainer.set_step(1)
        sync(1)
        by_two = rollout.generate.options(lazy=True)(batch)  # rows kept on the old ranks 0, 1
        trainer.set_step(2)
        sync(2)
        change = rollout.grow(2, sync=sync, version=2)
        assert change.added == (2, 3) and len(processes) == 4, "the two new ranks' processes were started now"
        _assert_current(rollout, 2, range(2, 4))
        assert rollout.generate(batch).batch["y"].equal(_fresh(4, 2, batch).batch["y"])
        assert rollout.reduce() == [4.0] * 4
        by_four = rollout.generate.options(lazy=True)(batch)
        before = driver_traffic()
        to_new = rollout.relay(by_two)  # new ranks 2, 3 take rows 4..7 from old rank 1
        to_old = rollout[0:2].relay(by_four)  # old rank 1 takes rows 4..7 from new ranks 2, 3
        assert (driver_traffic() - before).sent_bytes == 0, "rows went through the driver"
        assert to_new.batch["at"].tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
        assert to_new.batch["y"].equal(_fresh(2, 1, batch).batch["y"])
        assert to_old.batch["at"].tolist() == [0] * 4 + [1] * 4
        assert to_old.batch["y"].equal(_fresh(4, 2, batch).batch["y"])
        del by_two, by_four
        rollout.shrink(3)
        assert rollout.generate(batch).batch["y"].equal(_fresh(3, 2, batch).batch["y"])
        assert rollout.reduce() == [3.0] * 3
        assert [s[4] for s in rollout.state()] == [[(2, 4, (2, 3), ()), (4, 3, (), (3,))]] * 3
        assert _gone(processes[4].pid), "the removed rank's process is left behind"
        with pytest.raises(DispatchError, match=r"; 0 spares left: create the group with spare_ranks=1 "):
            rollout.replace_rank(1)  # replacements come from spares only
        rollout.grow(1, sync=sync, version=2)  # the transport again, without the removed process
        _assert_current(rollout, 2, range(3, 4))
        by_four = rollout.generate.options(lazy=True)(batch)
        mixed = rollout.ranks([3, 0]).relay(by_four)  # the newest rank and rank 0 swap rows with every other
        assert mixed.batch["at"].tolist() == [3] * 4 + [0] * 4
        assert mixed.batch["y"].equal(_fresh(4, 2, batch).batch["y"])
    finally:
        rollout.shutdown()
        trainer.shutdown()
    assert len(processes) == 5 and all(_gone(proc.pid) for proc in processes.values())


def test_shrink_refuses_while_lazy_rows_live_on_ranks_that_go_or_move() -> None:
    from dispatchcore._rows import ROW_STORE

    before = len(ROW_STORE)
    with WorkerGroup(Rollout, 3, lazy=True) as wg:
        wg.setup(7)
        kept = wg.generate(DataProto.from_dict({"x": torch.arange(6)}))
        with pytest.raises(DispatchError, match=r"rank 1: .*rank 2: "):
            wg.shrink(1)
        assert wg.world_size == 3
        del kept
        wg.shrink([1])
        assert wg.world_size == 2
        assert len(ROW_STORE) == before, "a removed rank's rows are left behind"


def test_resize_waits_for_the_call_in_flight() -> None:
    with WorkerGroup(Rollout, 2) as wg:
        wg.setup(7)
        batch = DataProto.from_dict({"x": torch.arange(4)}, meta_info={"sleep": 0.5})
        future = wg.generate.options(blocking=False)(batch)
        with trace() as tracer:
            wg.grow(1)
        assert future.done(), "grow returned before the call in flight finished"
        assert [e["name"] for e in tracer.events if e["ph"] == "X" and "grow" in e["name"]] == ["grow 2 -> 3"]
        assert future.get().batch["y"].equal(_fresh(2, None, batch).batch["y"]), "it ran on the old membership"
        assert wg.world_size == 3


def test_what_cannot_resize_says_why() -> None:
    for backend in ("mock", "faulty"):
        with WorkerGroup(Rollout, 2, backend=backend) as wg:
            with pytest.raises(DispatchError, match=f"'{backend}' backend cannot add ranks"):
                wg.grow(1)
            with pytest.raises(DispatchError, match=f"'{backend}' backend cannot remove ranks"):
                wg.shrink(1)
            assert wg.world_size == 2
    with WorkerGroup(Rollout, 2) as wg:
        with pytest.raises(DispatchError, match="on the group, not on a view"):
            wg[0:1].grow(1)
        with pytest.raises(ValueError, match="would leave no rank"):
            wg.shrink(0, 1)
        with pytest.raises(ValueError, match="number of ranks >= 1"):
            wg.grow(0)


def test_the_demo_grows_and_shrinks_its_rollout_group_and_learns_as_before() -> None:
    from dispatchcore.demo import DemoConfig, run_demo

    history = run_demo(DemoConfig(backend="local", world_size=2, steps=25, rollout_ranks=2, resize={8: 2, 16: -1}))
    assert [m.rollout_ranks for m in history] == [2] * 7 + [4] * 8 + [3] * 10
    first = sum(m.reward for m in history[:3]) / 3
    last = sum(m.reward for m in history[-3:]) / 3
    assert first < 0.3 and last > first + 0.3, (first, last)


def test_the_demo_refuses_a_resize_schedule_without_a_rollout_group(capsys: pytest.CaptureFixture[str]) -> None:
    from dispatchcore.demo.loop import main

    assert main(["--resize", "3:+1", "--steps", "4"]) != 0
    assert "--rollout-ranks" in capsys.readouterr().err


class MeshRollout(Rollout):
    """Two ranks per dp rank (think tensor parallel); the mesh follows the rank, declared again on a change."""

    def __init__(self) -> None:
        super().__init__()
        self._register_dispatch_collect_info("infer", self.rank // 2, self.rank % 2 == 0)

    def on_membership_change(self, change: Any) -> None:
        super().on_membership_change(change)
        self._register_dispatch_collect_info("infer", self.rank // 2, self.rank % 2 == 0)

    @register(make_nd_compute_dataproto_dispatch_fn("infer"))
    def infer(self, data: DataProto) -> DataProto:
        return DataProto.from_dict({"y": data.batch["x"] * 10 + self.rank // 2 + 100 * self.world_size})


def test_nd_meshes_and_roles_see_the_new_world() -> None:
    batch = DataProto.from_dict({"x": torch.arange(7)}, auto_padding=True)
    roles = create_colocated_worker_cls({"gen": MeshRollout})
    with WorkerGroup(MeshRollout, 2) as wg, WorkerGroup(MeshRollout, 4) as fresh, WorkerGroup(roles, 2) as colocated:
        wg.infer(batch)  # the mesh is asked (and cached) at 2 ranks
        wg.grow(2)
        assert wg.infer(batch).batch["y"].equal(fresh.infer(batch).batch["y"])
        gen = colocated.spawn(["gen"])["gen"]
        colocated.grow(2)
        assert gen.world_size == 4 and [s[1:3] for s in gen.state()] == [(r, 4) for r in range(4)]


LAUNCHED = textwrap.dedent(
    """
    import os
    import torch
    from dispatchcore import DataProto, Dispatch, DispatchError, Worker, WorkerGroup, collective, register

    class R(Worker):
        @register(Dispatch.DP_COMPUTE_PROTO)
        def gen(self, data):
            return DataProto.from_dict({"y": data.batch["x"] * 10 + self.rank * 1000 + self.world_size * 100000})

        @register(Dispatch.ONE_TO_ALL)
        def where(self):
            total = collective.all_reduce(torch.ones(1))
            return self.rank, self.world_size, int(os.environ["RANK"]), float(total[0])

    wg = WorkerGroup(R, 2, backend="torchrun")  # launch ranks 0, 1; 2 and 3 idle
    batch = DataProto.from_dict({"x": torch.arange(10)}, auto_padding=True)

    def same_as_fresh():
        with WorkerGroup(R, wg.world_size, backend="local") as fresh:
            assert wg.gen(batch).batch["y"].equal(fresh.gen(batch).batch["y"])

    wg.grow(2)
    print("grown", wg.where())
    same_as_fresh()
    try:
        wg.grow(1)
    except DispatchError as exc:
        print("refused:", exc)
    wg.shrink(1)
    print("shrunk", wg.where())
    same_as_fresh()
    wg.grow(1)  # onto launch rank 1, idle again
    print("regrown", wg.where())
    same_as_fresh()
    wg.shutdown()
    print("done")
    """
)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("torchrun") is None, reason="torchrun is not on PATH")
def test_under_the_launcher_a_group_grows_onto_idle_ranks_only(tmp_path: Path) -> None:
    script = tmp_path / "driver.py"
    script.write_text(LAUNCHED)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHELASTIC", "RANK", "MASTER_"))}
    command = [shutil.which("torchrun") or "torchrun", "--standalone", "--nproc-per-node=4", str(script)]
    run = subprocess.run(command, capture_output=True, text=True, timeout=200, env={**env, "PYTHONUNBUFFERED": "1"})
    assert run.returncode == 0, run.stderr[-3000:]
    out = run.stdout
    assert "grown [(0, 4, 0, 4.0), (1, 4, 1, 4.0), (2, 4, 2, 4.0), (3, 4, 3, 4.0)]" in out
    assert "refused: under the torchrun launcher a group grows only onto idle ranks of the launch" in out
    assert "shrunk [(0, 3, 0, 3.0), (1, 3, 2, 3.0), (2, 3, 3, 3.0)]" in out
    # RANK: the group rank a process's worker was built as (a plain init_process_group() meets the group's ranks)
    assert "regrown [(0, 4, 0, 4.0), (1, 4, 2, 4.0), (2, 4, 3, 4.0), (3, 4, 3, 4.0)]" in out
    assert out.rstrip().endswith("done")


@pytest.mark.slow
def test_a_pooled_ray_group_grows_into_a_new_placement_group(request: pytest.FixtureRequest) -> None:
    """A placement group is fixed-size: a grow reserves one like the pool's, gone with its last rank."""
    pytest.importorskip("ray")
    ray = request.getfixturevalue("ray_session")
    from executors_ray import RayResourcePool

    def reserved() -> int:
        return sum(pg["state"] == "CREATED" for pg in ray.util.placement_group_table().values())

    before = reserved()
    pool = RayResourcePool([2], use_gpu=False, cpus_per_process=0.5)
    with WorkerGroup(Rollout, 2, backend="ray", resource_pool=pool) as wg:
        wg.setup(7)
        wg.grow(2)
        assert reserved() == before + 2
        assert [s[1:3] for s in wg.state()] == [(r, 4) for r in range(4)]
        wg.shrink(3)
        assert reserved() == before + 2  # rank 2 still lives in the grow's placement group
        wg.shrink(2)
        assert reserved() == before + 1
        wg.grow(1)
        assert reserved() == before + 2
    assert reserved() == before  # the grow's placement group went with the group (the pool's with its last user)


class Sharded(Worker):
    """Holds torch's default group over its ranks, as an FSDP2 trainer does (a DeviceMesh of fixed size)."""

    def __init__(self) -> None:
        self.mesh = collective.init_process_group()

    @register(Dispatch.ONE_TO_ALL)
    def size(self) -> int:
        return int(self.mesh.size())


@pytest.mark.slow
def test_a_sharded_group_is_refused_with_the_way() -> None:
    with WorkerGroup(Sharded, 2, backend="torchrun") as wg:
        for resize in (lambda: wg.grow(1), lambda: wg.shrink(1)):
            with pytest.raises(DispatchError, match=r"is sharded: rank\(s\) \[0, 1\] .*re-shard from the checkpoint"):
                resize()
        assert wg.size() == [2, 2]
