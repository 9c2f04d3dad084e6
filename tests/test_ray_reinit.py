"""Ray sessions that come and go under a driver's groups (issue 40, items 4 and 11), and Ray's token.

verl's tests call ``ray.init()`` and ``ray.shutdown()`` per test and leave
their groups standing; a group's shutdown must not make its ranks print
torch's store traces.  Both run in a driver of their own (a subprocess),
whose Rays are its own: this test process's Ray is never touched.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("ray")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]

ROUNDS = 2  # the first on the Ray the library starts, the next on the user's ray.init()

DRIVER = textwrap.dedent(
    """
    import sys, threading, time

    import ray
    import torch

    from dispatchcore import Dispatch, Worker, WorkerGroup, collective, register

    class Summer(Worker):
        @register(Dispatch.ONE_TO_ALL)
        def total(self):
            t = torch.ones(2) * (self.rank + 1)
            collective.all_reduce(t)  # each rank now holds a client of the group's store
            return t.tolist()

    def ours(prefix="dispatchcore"):
        return [t.name for t in threading.enumerate() if t.name.startswith(prefix)]

    def settle(prefix="dispatchcore", bound=30.0):
        deadline = time.monotonic() + bound
        while ours(prefix) and time.monotonic() < deadline:
            time.sleep(0.05)
        return ours(prefix)

    def session(round, **options):
        shut = WorkerGroup(Summer, 2, backend="ray", **options)
        assert shut.total() == [[3.0, 3.0]] * 2
        shut.shutdown()
        print("STORE THREADS LEFT", settle("dispatchcore-ray-store"), flush=True)
        left = WorkerGroup(Summer, 2, backend="ray")  # left standing, as verl's tests do
        assert left.total() == [[3.0, 3.0]] * 2
        ray.shutdown()  # the user's, under a standing group
        print("ROUND", round, "THREADS LEFT", settle(), flush=True)

    session(0, num_cpus=2)  # no Ray yet: the library starts one (and makes Ray's token file)
    for round in range(1, int(sys.argv[1])):
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=True, _temp_dir=sys.argv[2])
        session(round)
    print("DONE", time.monotonic(), flush=True)
    """
)


def test_ray_sessions_come_and_go_under_standing_groups_quietly(tmp_path: Path) -> None:
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    ray_dir = tempfile.mkdtemp(prefix="dcray", dir="/tmp")  # Ray's socket paths must stay short
    home = tmp_path / "home"  # where Ray keeps its token: a fresh one, which the library makes
    home.mkdir()
    hidden = ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")
    env = {**{k: v for k, v in os.environ.items() if k not in hidden}, "HOME": str(home)}
    try:
        done = subprocess.run(
            [sys.executable, str(script), str(ROUNDS), ray_dir],
            capture_output=True,
            text=True,
            timeout=360,
            env=env,
        )
        worker_logs = "".join(p.read_text(errors="replace") for p in Path(ray_dir).glob("session_*/logs/worker-*"))
    finally:
        shutil.rmtree(ray_dir, ignore_errors=True)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    # Ray's token authentication guards the Ray calls that carry the lane secret; its token is this user's alone.
    token = home / ".ray" / "auth_token"
    assert stat.S_IMODE(token.stat().st_mode) == 0o600 and len(token.read_text()) == 64
    for round in range(ROUNDS):  # every round's calls worked, and no thread of ours outlived its session
        assert f"ROUND {round} THREADS LEFT []" in out, out[-4000:]
    assert out.count("STORE THREADS LEFT []") == ROUNDS, out[-4000:]
    for noise in ("Perhaps you called ray.init twice", "owner is unknown", "Exception in thread"):
        assert noise not in out, out[-4000:]
    # A rank whose store went first prints torch's C++ trace: not in the driver's output, nor in any actor's log.
    assert "recvValueWithTimeout" not in out + worker_logs
