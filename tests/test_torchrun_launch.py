"""Real ``torchrun --standalone`` launches: the example driver, user process groups, failures."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(150),
    pytest.mark.skipif(shutil.which("torchrun") is None, reason="torchrun is not on PATH"),
]

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "torchrun_driver.py"


def torchrun(script: Path, *args: str, nproc: int = 2, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHELASTIC", "RANK", "MASTER_"))}
    env["PYTHONUNBUFFERED"] = "1"
    command = [shutil.which("torchrun") or "torchrun", "--standalone", f"--nproc-per-node={nproc}", str(script), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)


def test_example_driver_same_output_as_local() -> None:
    launched = torchrun(EXAMPLE)
    assert launched.returncode == 0, launched.stderr[-3000:]
    local = subprocess.run(
        [sys.executable, str(EXAMPLE), "--backend", "local"], capture_output=True, text=True, timeout=120, check=True
    )
    assert launched.stdout == local.stdout
    assert "done" in local.stdout and "critic values: [276.0]" in local.stdout


DRIVER = textwrap.dedent(
    """
    import os, sys, time
    import torch
    import torch.distributed as dist
    from dispatchcore import DataProto, Dispatch, Worker, WorkerGroup, driver_traffic, register


    class Trainer(Worker):
        def __init__(self):
            dist.init_process_group("gloo")  # the user's own default group

        @register(Dispatch.ONE_TO_ALL)
        def allreduce(self, value):
            t = torch.tensor([float(value + self.rank)])
            dist.all_reduce(t)
            return t.item()

        @register(Dispatch.DP_COMPUTE_PROTO)
        def step(self, data):
            total = data.batch["x"].sum().reshape(1).float()
            dist.all_reduce(total)
            return DataProto.from_dict({"x": data.batch["x"] * 2, "total": total.repeat(len(data))})

        @register(Dispatch.ONE_TO_ALL)
        def env(self):
            return (os.environ["RANK"], os.environ["WORLD_SIZE"], dist.get_rank(), dist.get_world_size())

        @register(Dispatch.ONE_TO_ALL)
        def die(self, rank):
            if self.rank == rank:
                os._exit(7)
            time.sleep(60)


    class Single(Worker):
        @register(Dispatch.ONE_TO_ALL)
        def where(self):
            return (self.rank, self.world_size, os.environ["RANK"])

        @register(Dispatch.DP_COMPUTE_PROTO)
        def plus(self, data):
            return DataProto.from_dict({"x": data.batch["x"] + 1})


    wg = WorkerGroup(Trainer, backend="torchrun")
    print("env", wg.env())
    print("between", wg.allreduce(1))
    data = DataProto.from_dict({"x": torch.arange(8)})
    for _ in range(3):
        out = wg.step(data)
    print("inside", out.batch["x"].tolist(), out.batch["total"].tolist())
    print("between", wg.allreduce(10))
    big = DataProto.from_dict({"x": torch.arange(1 << 20)})
    print("big", torch.equal(wg.step(big).batch["x"], big.batch["x"] * 2))
    print("subset", WorkerGroup(Single, backend="torchrun", ranks=[1]).where())  # world_size: len(ranks)
    lazy = wg.step.options(lazy=True)(data)  # rows stay in processes 0 (the driver) and 1
    swapped = WorkerGroup(Single, 2, backend="torchrun", ranks=[1, 0])  # each rank's rows are in the other
    before = driver_traffic()
    print("lazy", swapped.plus(lazy).batch["x"].tolist(), (driver_traffic() - before).sent_bytes)
    wg.shutdown()  # one group ends; rank 1 keeps serving the others
    print("after shutdown", WorkerGroup(Single, 2, backend="torchrun").where())
    mode = sys.argv[1]
    if mode == "die":
        wg2 = WorkerGroup(Trainer, backend="torchrun")
    if mode == "raise":
        raise RuntimeError("driver failed on purpose")
    print("ok")
    """
)


@pytest.fixture(scope="module")
def driver(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("torchrun") / "driver.py"
    path.write_text(DRIVER)
    return path


def test_user_process_group_subsets_and_clean_exit(driver: Path) -> None:
    result = torchrun(driver, "ok")
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert lines == [
        "env [('0', '2', 0, 2), ('1', '2', 1, 2)]",
        "between [3.0, 3.0]",
        "inside [0, 2, 4, 6, 8, 10, 12, 14] [28.0, 28.0, 28.0, 28.0, 28.0, 28.0, 28.0, 28.0]",
        "between [21.0, 21.0]",
        "big True",
        "subset [(0, 1, '0')]",  # RANK is the group's (a plain init_process_group() meets its ranks)
        "lazy [1, 3, 5, 7, 9, 11, 13, 15] 0",
        "after shutdown [(0, 2, '0'), (1, 2, '1')]",
        "ok",
    ]


def test_exception_escaping_the_driver_stops_the_ranks(driver: Path) -> None:
    result = torchrun(driver, "raise")
    assert result.returncode != 0
    assert "driver failed on purpose" in result.stderr
    # Only the driver failed: rank 1 was told to stop and exited 0.
    assert "rank      : 1" not in result.stderr


DYING = textwrap.dedent(
    """
    import os, time
    from dispatchcore import Dispatch, Worker, WorkerGroup, register

    class Dies(Worker):
        @register(Dispatch.ONE_TO_ALL)
        def die(self, rank):
            if self.rank == rank:
                os._exit(7)
            time.sleep(60)

    wg = WorkerGroup(Dies, backend="torchrun")
    wg.die(1)
    print("unreachable")
    """
)


def test_dead_rank_exits_the_driver_nonzero_naming_it(tmp_path: Path) -> None:
    script = tmp_path / "dying.py"
    script.write_text(DYING)
    result = torchrun(script, timeout=90)
    assert result.returncode != 0
    assert "unreachable" not in result.stdout
    assert "WorkerDiedError: worker rank 1 died" in result.stderr


UNPICKLABLE = textwrap.dedent(
    """
    import threading
    from dispatchcore import Dispatch, UnpicklableError, Worker, WorkerGroup, register


    class Registry:
        lock = threading.Lock()


    class UsesRegistry(Worker):
        @register(Dispatch.ONE_TO_ALL)
        def step(self):
            return Registry.__name__


    class Plain(Worker):
        @register(Dispatch.RANK_ZERO)
        def zero(self, cfg):
            return 1


    try:
        WorkerGroup(UsesRegistry, 2, backend="torchrun")
    except UnpicklableError as exc:
        print("refused:", exc)
    wg = WorkerGroup(Plain, 2, backend="torchrun")
    try:
        wg.zero({"x": threading.Event()})  # worker 0 lives in the driver: its copy is checked first
    except UnpicklableError as exc:
        print("refused:", exc)
    print("after:", wg.zero(1))
    """
)


def test_unpicklable_worker_class_and_arguments_are_refused_by_the_driver_only(tmp_path: Path) -> None:
    """Under the launcher the other ranks serve from the first ``WorkerGroup(...)``: only the driver refuses."""
    script = tmp_path / "unpicklable.py"
    script.write_text(UNPICKLABLE)
    result = torchrun(script, timeout=90)
    assert result.returncode == 0, result.stderr[-3000:]
    refused = [line for line in result.stdout.splitlines() if line.startswith("refused:")]
    assert len(refused) == 2, result.stdout
    assert "worker class UsesRegistry → UsesRegistry.step → Registry.lock cannot be pickled" in refused[0]
    assert "call 'zero' was not sent: argument 'cfg' → cfg['x'] cannot be pickled" in refused[1]
    assert "after: 1" in result.stdout
