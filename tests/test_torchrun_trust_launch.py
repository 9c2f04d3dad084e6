"""A real ``torchrun --standalone --nproc-per-node=2`` launch against a stranger on this machine (issue 39).

While the launch serves, a separate process pushes pickles onto every key the library once read in
the launcher's store (the prefix is the rendezvous id, listed by the store) and knocks on every port
the driver listens on as a rank without the secret.  No marker file appears, the group keeps serving
(calls, rows rank to rank, a driver read), every listener of the driver and its rank is on loopback,
and the launch's secret file is gone once every process is up.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from _stranger import listening

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(180),
    pytest.mark.skipif(shutil.which("torchrun") is None, reason="torchrun is not on PATH"),
    pytest.mark.skipif(not Path("/proc/self/net/tcp").exists(), reason="needs Linux /proc"),
]

ROOT = Path(__file__).resolve().parents[1]
STRANGER = str(Path(__file__).with_name("_stranger.py"))

DRIVER = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    import torch
    from dispatchcore import DataProto, Dispatch, Worker, WorkerGroup, register


    class Keeper(Worker):
        @register(Dispatch.DP_COMPUTE_PROTO)
        def double(self, data):
            return DataProto.from_dict({"x": data.batch["x"] * 2})

        @register(Dispatch.ONE_TO_ALL)
        def pid(self):
            return os.getpid()


    def serves(wg):
        data = DataProto.from_dict({"x": torch.arange(8)})
        lazy = wg.double.options(lazy=True)(data)
        assert torch.equal(wg.ranks([1, 0]).double(lazy).batch["x"], data.batch["x"] * 4)
        assert torch.equal(lazy.batch["x"], data.batch["x"] * 2)


    store = (os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"])  # the launch's, before a group rewrites them
    wg = WorkerGroup(Keeper, 2, backend="torchrun")
    serves(wg)
    print("store", *store, flush=True)
    print("pids", *wg.pid(), flush=True)
    go = Path(sys.argv[1])
    while not go.exists():
        time.sleep(0.05)
    for _ in range(3):
        serves(wg)
    print("served", flush=True)
    """
)


def is_loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


def test_a_stranger_runs_nothing_in_a_launch_and_it_keeps_serving(tmp_path: Path) -> None:
    script, go, marker = tmp_path / "driver.py", tmp_path / "go", tmp_path / "ran"
    script.write_text(DRIVER)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHELASTIC", "RANK", "MASTER_", "DISPATCHCORE"))}
    env.update(PYTHONUNBUFFERED="1", XDG_RUNTIME_DIR=str(tmp_path))  # the launch's secret file goes under tmp_path
    command = [shutil.which("torchrun") or "torchrun", "--standalone", "--nproc-per-node=2", str(script), str(go)]
    pids: list[int] = []
    launch = subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        assert launch.stdout is not None
        said = {}
        while len(said) < 2 and (line := launch.stdout.readline()):
            said[line.split()[0]] = line.split()[1:]
        assert len(said) == 2, launch.communicate(timeout=60)[1][-3000:]
        pids[:] = [int(p) for p in said["pids"]]
        assert (tmp_path / "dispatchcore").is_dir() and not list((tmp_path / "dispatchcore").iterdir())
        sockets = {pid: listening(pid) for pid in pids}
        exposed = {pid: [s for s in found if not is_loopback(s[0])] for pid, found in sockets.items()}
        assert all(sockets.values()) and not any(exposed.values()), f"listening beyond loopback: {exposed}"
        host, port = said["store"]
        stranger = [sys.executable, STRANGER]
        pushed = subprocess.run(
            [*stranger, "pickles", host, port, str(marker)], env=env, capture_output=True, text=True
        )
        assert pushed.returncode == 0 and int(pushed.stdout.split()[0]) > 0, pushed.stderr  # found the launch's prefix
        ports = [str(p) for _, p in sockets[pids[0]]]
        knocked = subprocess.run([*stranger, "knock", *ports], env=env, capture_output=True, text=True, timeout=60)
        verdicts = dict(line.split() for line in knocked.stdout.splitlines())
        assert "refused" in verdicts.values() and "admitted" not in verdicts.values(), verdicts
        go.touch()
        out, err = launch.communicate(timeout=120)
    finally:
        if launch.poll() is None:
            os.killpg(launch.pid, signal.SIGKILL)  # the agent (its processes may have sessions of their own)
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            launch.communicate(timeout=30)
    assert launch.returncode == 0, err[-3000:]
    assert "served" in out
    assert not marker.exists(), "a process of the launch ran a pickle a stranger pushed onto the store"
