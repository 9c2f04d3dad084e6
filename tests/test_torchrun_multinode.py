"""Two torchrun agents (``--nnodes=2``, c10d rendezvous on 127.0.0.1) running one driver script.

Each agent stands for a node: groups span both, ``ranks=[...]`` places a
group on chosen processes, results equal ``--backend local``, and killing
the second node's processes ends the driver non-zero, naming the lost rank.
The driver's own agent does not stop the driver when the other node's ranks
die, so it is the executor's liveness check that catches it.  Both nodes get
one ``DISPATCHCORE_SECRET``, as a multi-node launch needs.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from dispatchcore.executor import LOOPBACK, free_port

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(240),
    pytest.mark.skipif(shutil.which("torchrun") is None, reason="torchrun is not on PATH"),
]

DRIVER = textwrap.dedent(
    """
    import os, sys, time
    import torch
    from dispatchcore import DataProto, Dispatch, Worker, WorkerGroup, register


    class Placed(Worker):
        @register(Dispatch.ONE_TO_ALL)
        def where(self):
            return self.rank, os.environ.get("GROUP_RANK", "0"), os.environ.get("LOCAL_RANK", str(self.rank))

        @register(Dispatch.DP_COMPUTE_PROTO)
        def scale(self, data):
            return DataProto.from_dict({"y": data.batch["x"] * (self.rank + 1)})


    backend = sys.argv[1]
    mode = sys.argv[2]
    under = backend == "torchrun"
    everyone = WorkerGroup(Placed, 4, backend=backend, death_timeout=5)
    pair = WorkerGroup(Placed, 2, backend=backend, **({"ranks": [1, 3]} if under else {}))
    data = DataProto.from_dict({"x": torch.arange(8, dtype=torch.float32)})
    print("scaled:", everyone.scale(data).batch["y"].tolist(), flush=True)
    print("pair scaled:", pair.scale(data).batch["y"].tolist(), flush=True)
    if under:
        print("nodes:", sorted({node for _, node, _ in everyone.where()}), flush=True)
        print("pair nodes:", [node for _, node, _ in pair.where()], flush=True)
    if mode == "die":
        print("ready", flush=True)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            everyone.where()
            time.sleep(0.1)
        print("the lost ranks were never reported", flush=True)
        sys.exit(3)
    print("done", flush=True)
    """
)


def agents(script: Path, mode: str, cwd: Path) -> tuple[subprocess.Popen[str], subprocess.Popen[str]]:
    """Node 0 (runs the driver as world rank 0) and node 1, two processes each."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHELASTIC", "RANK", "MASTER_", "GROUP_"))}
    env["PYTHONUNBUFFERED"] = "1"
    env["DISPATCHCORE_SECRET"] = secrets.token_hex(32)  # a multi-node launch's shared lane secret, on every node
    port = free_port(LOOPBACK)
    launched = []
    for node in (0, 1):
        command = [
            shutil.which("torchrun") or "torchrun",
            "--nnodes=2",
            f"--node-rank={node}",
            "--nproc-per-node=2",
            "--max-restarts=0",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={LOOPBACK}:{port}",
            f"--rdzv-id=multinode-{port}",
            str(script),
            "torchrun",
            mode,
        ]
        launched.append(
            subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        )
        if node == 0:
            time.sleep(1.0)  # node 0's agent hosts the rendezvous store: it joins first
    return launched[0], launched[1]


def children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            if int(stat[stat.rfind(")") + 2 :].split()[1]) == pid:
                found.append(int(entry))
    return found


@pytest.fixture
def driver(tmp_path: Path) -> Path:
    path = tmp_path / "driver.py"
    path.write_text(DRIVER)
    return path


def test_groups_span_both_nodes_and_match_local(driver: Path, tmp_path: Path) -> None:
    node0, node1 = agents(driver, "ok", tmp_path)
    out0, err0 = node0.communicate(timeout=180)
    _, err1 = node1.communicate(timeout=60)
    assert node0.returncode == 0 and node1.returncode == 0, err0[-3000:] + err1[-3000:]
    assert "nodes: ['0', '1']" in out0  # world ranks 0-1 on node 0, 2-3 on node 1
    assert "pair nodes: ['0', '1']" in out0  # ranks=[1, 3]: one process on each node
    local = subprocess.run(
        [sys.executable, str(driver), "local", "ok"], capture_output=True, text=True, timeout=120, check=True
    )
    for line in local.stdout.splitlines():
        assert line in out0.splitlines(), (line, out0)


def test_losing_the_second_node_ends_the_driver_naming_the_rank(driver: Path, tmp_path: Path) -> None:
    node0, node1 = agents(driver, "die", tmp_path)
    try:
        assert node0.stdout is not None
        for line in node0.stdout:
            if line.strip() == "ready":
                break
        else:
            pytest.fail("the driver never got ready: " + (node0.stderr.read() if node0.stderr else ""))
        for pid in children(node1.pid):  # node 1's worker processes, as a lost machine takes them
            os.kill(pid, signal.SIGKILL)
        rest, err0 = node0.communicate(timeout=120)
    finally:
        for agent in (node0, node1):
            if agent.poll() is None:
                agent.kill()
            agent.communicate(timeout=30)
    assert node0.returncode != 0
    assert "never reported" not in rest
    assert "WorkerDiedError: worker rank 2 died" in err0 or "WorkerDiedError: worker rank 3 died" in err0, err0[-3000:]
