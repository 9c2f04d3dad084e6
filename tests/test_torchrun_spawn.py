"""The torchrun backend outside torchrun: self-started ranks, their env, their lifetime."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from dispatchcore import DataProto, Dispatch, DispatchError, Worker, WorkerGroup, available_backends, register

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

ENV_NAMES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def spawned_children(pid: int | None = None) -> list[int]:
    """Live processes whose parent is ``pid`` (default: this test process) running a rank."""
    parent = os.getpid() if pid is None else pid
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == parent and fields[0] != "Z" and b"executors_torchrun._spawn" in cmdline:
            found.append(int(entry.name))
    return found


class PGWorker(Worker):
    """Initialises its own default process group, as user code does."""

    def __init__(self) -> None:
        import torch.distributed as dist

        dist.init_process_group("gloo")
        self.dist = dist

    @register(Dispatch.ONE_TO_ALL)
    def env(self) -> dict[str, str | None]:
        return {name: os.environ.get(name) for name in ENV_NAMES}

    @register(Dispatch.ONE_TO_ALL)
    def threads(self) -> tuple[str | None, int]:
        return os.environ.get("OMP_NUM_THREADS"), torch.get_num_threads()

    @register(Dispatch.ONE_TO_ALL)
    def allreduce(self, value: float) -> float:
        t = torch.tensor([value + self.rank])
        self.dist.all_reduce(t)
        return float(t.item())

    @register(Dispatch.DP_COMPUTE_PROTO)
    def step(self, data: DataProto) -> DataProto:
        total = data.batch["x"].sum().reshape(1).double()
        self.dist.all_reduce(total)
        return DataProto.from_dict({"x": data.batch["x"] + 1, "total": total.repeat(len(data))})

    @register(Dispatch.ONE_TO_ALL)
    def pid(self) -> int:
        return os.getpid()


@pytest.fixture(scope="module")
def pg_group() -> Iterator[WorkerGroup[PGWorker]]:
    if "torchrun" not in available_backends():
        pytest.skip("torchrun backend unavailable")
    before = {k: os.environ.get(k) for k in ENV_NAMES}
    others = set(spawned_children())  # ranks of groups other modules keep for the whole run
    wg = WorkerGroup(PGWorker, 2, backend="torchrun")
    assert {k: os.environ.get(k) for k in ENV_NAMES} == before, "the driver's environment changed"
    yield wg
    wg.shutdown()
    assert set(spawned_children()) <= others, "a rank outlived its group"


def test_children_get_the_env_contract(pg_group: WorkerGroup[PGWorker]) -> None:
    envs = pg_group.env()
    assert [e["RANK"] for e in envs] == ["0", "1"]
    assert {e["WORLD_SIZE"] for e in envs} == {"2"}
    assert [e["LOCAL_RANK"] for e in envs] == ["0", "1"]
    assert len({(e["MASTER_ADDR"], e["MASTER_PORT"]) for e in envs}) == 1


def test_ranks_share_the_cores_instead_of_each_taking_all(pg_group: WorkerGroup[PGWorker]) -> None:
    """Two ranks on one host get half the cores each for torch's intra-op pool (or the user's own setting)."""
    cores = len(os.sched_getaffinity(0))
    expected = os.environ.get("OMP_NUM_THREADS") or str(max(1, cores // 2))
    assert pg_group.threads() == [(expected, int(expected))] * 2


def test_user_collectives_between_and_inside_calls(pg_group: WorkerGroup[PGWorker]) -> None:
    assert pg_group.allreduce(1.0) == [3.0, 3.0]
    data = DataProto.from_dict({"x": torch.arange(10, dtype=torch.float64)})
    for _ in range(3):
        out = pg_group.step(data)
        assert out.batch["x"].tolist() == [float(i + 1) for i in range(10)]
        assert out.batch["total"].tolist() == [45.0] * 10
    assert pg_group.allreduce(5.0) == [11.0, 11.0]


def test_large_and_uneven_payloads(pg_group: WorkerGroup[PGWorker]) -> None:
    data = DataProto.from_dict({"x": torch.randn(3 * (1 << 18) + 1, dtype=torch.float64)}, auto_padding=True)
    out = pg_group.step(data)
    assert torch.equal(out.batch["x"], data.batch["x"] + 1)


def test_a_rank_process_prints_its_stacks_on_the_stacks_signal(
    pg_group: WorkerGroup[PGWorker], capsys: pytest.CaptureFixture[str]
) -> None:
    """What the driver sends a process that never connected before it raises; a user may send it too."""
    from executors_torchrun import STACKS_SIGNAL

    if STACKS_SIGNAL is None:
        pytest.skip("no real-time signals on this platform")
    pid = pg_group.pid()[1]
    capsys.readouterr()
    os.kill(pid, STACKS_SIGNAL)
    err, deadline = "", time.monotonic() + 30
    while "in serve_process" not in err and time.monotonic() < deadline:
        time.sleep(0.1)
        err += capsys.readouterr().err
    stack = [line for line in err.splitlines() if "rank 1)" in line]
    assert any("in serve_process" in line for line in stack), err[-2000:]  # its main thread, labelled
    assert pg_group.pid()[1] == pid, "the process prints and goes on serving"


def test_classes_and_lambdas_defined_in_a_function_travel_by_value() -> None:
    class Local(Worker):
        def __init__(self, base: int) -> None:
            self.base = base

        @register(Dispatch.DP_COMPUTE_PROTO_WITH_FUNC)
        def apply(self, fn, data: DataProto) -> DataProto:  # noqa: ANN001
            return fn(data, self.base)

    bump = 7
    before = set(spawned_children())
    with WorkerGroup(Local, 2, backend="torchrun", init_kwargs={"base": 100}, isolate=False) as wg:
        out = wg.apply(
            lambda d, base: DataProto.from_dict({"x": d.batch["x"] + base + bump}),
            DataProto.from_dict({"x": torch.arange(4)}),
        )
        assert out.batch["x"].tolist() == [107, 108, 109, 110]
    assert set(spawned_children()) <= before


def test_bad_options_fail_before_starting_anything() -> None:
    before = set(spawned_children())
    with pytest.raises(TypeError, match="unknown option"):
        WorkerGroup(PGWorker, 2, backend="torchrun", bogus=1)
    with pytest.raises(ValueError, match="world_size"):
        WorkerGroup(PGWorker, 2, backend="torchrun", ranks=[0])
    with pytest.raises(ValueError, match="world_size is required"):
        WorkerGroup(PGWorker, backend="torchrun")
    assert set(spawned_children()) <= before


def test_plugin_import_is_lazy() -> None:
    code = "import sys, executors_torchrun.plugin; print('executors_torchrun._executor' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_launch_world_size_only_under_torchrun(monkeypatch: pytest.MonkeyPatch) -> None:
    from executors_torchrun import TorchrunExecutor

    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    assert TorchrunExecutor.launch_world_size() is None
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "x")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "3")
    assert TorchrunExecutor.launch_world_size() == 3


@pytest.mark.timeout(60)  # the bound: a death is reported, never waited out
def test_calls_after_a_death_say_the_group_is_broken() -> None:
    from dispatchcore import WorkerDiedError
    from dispatchcore.testing.workers import EchoWorker

    before = set(spawned_children())
    wg = WorkerGroup(EchoWorker, 2, backend="torchrun", death_timeout=5)
    try:
        with pytest.raises(WorkerDiedError) as info:
            wg.exit_on(0)
        assert info.value.rank == 0
        with pytest.raises(DispatchError, match="no more calls"):
            wg.info()
    finally:
        wg.shutdown()
    assert set(spawned_children()) <= before


DRIVER = textwrap.dedent(
    """
    import os, sys
    from dispatchcore import WorkerGroup
    from dispatchcore.testing.workers import EchoWorker
    wg = WorkerGroup(EchoWorker, 2, backend="torchrun")
    print(" ".join(str(i["pid"]) for i in wg.info()), flush=True)
    sys.stdin.readline()
    os._exit(9)  # the driver dies without shutting anything down
    """
)


def test_ranks_exit_when_the_driver_dies() -> None:
    driver = subprocess.Popen([sys.executable, "-c", DRIVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert driver.stdout is not None and driver.stdin is not None
        pids = [int(p) for p in driver.stdout.readline().split()]
        assert len(pids) == 2
        driver.stdin.write("\n")
        driver.stdin.flush()
        assert driver.wait(30) == 9
        deadline = time.monotonic() + 20
        while any(Path(f"/proc/{p}").exists() and "Z" not in _state(p) for p in pids):
            assert time.monotonic() < deadline, f"ranks {pids} outlived their driver"
            time.sleep(0.1)
    finally:
        driver.kill()
        driver.wait()
        for stream in (driver.stdin, driver.stdout):
            if stream is not None:
                stream.close()


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "Z"


@pytest.mark.timeout(60)
def test_a_child_that_fails_before_serving_exits_at_once_saying_why() -> None:
    """A self-started child whose start raises prints the traceback and exits 1 (``os._exit``), so the
    driver sees a death at once: the interpreter's own exit could wait forever in torch's destructors."""
    env = {k: v for k, v in os.environ.items() if k != "DISPATCHCORE_TORCHRUN_BOOT"}
    child = subprocess.Popen(
        [sys.executable, "-c", "from executors_torchrun._child import main; main()"],
        stdin=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    assert child.stdin is not None and child.stderr is not None
    child.stdin.write(b"00" * 32 + b"\n")  # a secret line, as the driver writes; no boot description follows
    child.stdin.flush()
    try:
        assert child.wait(timeout=30) == 1  # while the pipe from the driver is still open
        err = child.stderr.read().decode()
    finally:
        child.kill()
        child.stdin.close()
        child.stderr.close()
    assert "Traceback" in err and "KeyError" in err, err
