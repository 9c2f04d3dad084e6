"""The driver process is SIGKILLed mid-call: what it started goes by itself; a detached Ray group stays.

Each driver is a subprocess running a real script; the test kills it with
SIGKILL (no handler, no atexit) while it waits on a call, then waits, with
the test's timeout as the bound, until every rank process, and every
process of a local Ray the driver started, is gone.  A detached group on a
Ray that outlives the driver is meant to stay: another driver attaches to
it afterwards, while the driver's ordinary group on that Ray is gone.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from ._harness import FAULT_TABLE, alive, backend_params, fault_row, full_only, wait_until_gone
from ._leaks import Snapshot, descendants, settle

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


_SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    config = json.loads(sys.argv[1])
    if config.get("ray_address"):  # a Ray that outlives this driver, or "local": one this driver starts
        import ray
        extra = {"num_cpus": 2, "include_dashboard": False} if config["ray_address"] == "local" else {}
        ray.init(address=config["ray_address"], log_to_driver=False, **extra)
    from dispatchcore import WorkerGroup
    from dispatchcore.testing.workers import EchoWorker
    info = {"driver": os.getpid()}
    if config.get("detached"):
        kept = WorkerGroup(EchoWorker, 2, backend="ray", detached=True, name=config["detached"])
        info["detached"] = [i["pid"] for i in kept.info()]
    wg = WorkerGroup(EchoWorker, 2, backend=config["backend"], **config.get("options", {}))
    info["ranks"] = [i["pid"] for i in wg.info()]
    print(json.dumps(info), flush=True)
    wg.sleep(3600)  # killed in this call
    """
)


class Driver:
    """A driver script in a subprocess; ``info`` is what it printed once its groups were up."""

    def __init__(self, tmp_path: Path, **config: Any) -> None:
        self._log = tmp_path / "driver.log"
        with open(self._log, "w") as log:
            self.proc = subprocess.Popen(  # noqa: S603 - our interpreter, our script
                [sys.executable, "-c", _SCRIPT, json.dumps(config)],
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
            )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait()
            pytest.fail(f"the driver exited with {self.proc.returncode} before its groups were up:\n{self.log()}")
        self.info: dict[str, Any] = json.loads(line)
        #: Every process the driver started (Ray's daemons included), before it dies.
        self.descendants = sorted(descendants(self.proc.pid))

    def log(self) -> str:
        return self._log.read_text()[-4000:]

    def kill(self) -> float:
        """SIGKILL the driver a moment into its call; returns the moment."""
        time.sleep(0.5)
        os.kill(self.proc.pid, signal.SIGKILL)
        killed = time.monotonic()
        self.proc.wait()
        return killed

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


@pytest.mark.parametrize("backend", backend_params(("torchrun", "multiprocess"), full=("multiprocess",)))
def test_ranks_exit_when_their_driver_is_killed(backend: str, tmp_path: Path, record: Any) -> None:
    driver = Driver(tmp_path, backend=backend)
    try:
        ranks = driver.info["ranks"]
        assert all(alive(p) for p in ranks)
        killed = driver.kill()
        gone = wait_until_gone(ranks + driver.descendants)
    finally:
        driver.close()
    record(
        FAULT_TABLE.format(backend=backend),
        **fault_row(
            "driver SIGKILLed mid-call",
            None,
            gone - killed,
            "-",
            "n/a (driver gone)",
            "none: every rank process exited",
            **{"detected as": "ranks exit by themselves", "time to detect (s)": round(gone - killed, 3)},
        ),
    )


@full_only  # ~40 s, and a minute more for Ray's agents to leave
@pytest.mark.parametrize("backend", backend_params(("ray",)))
def test_a_local_ray_started_by_the_driver_goes_with_it(backend: str, tmp_path: Path, record: Any) -> None:
    driver = Driver(tmp_path, backend="ray", ray_address="local")  # never a Ray that is already running
    try:
        ranks = driver.info["ranks"]
        ray_processes = [p for p in driver.descendants if p not in ranks]
        daemons = [p for p in ray_processes if _is_core_daemon(p)]
        assert daemons, f"no raylet/gcs_server among the driver's children {ray_processes}"
        killed = driver.kill()
        ranks_gone = wait_until_gone(ranks)
        daemons_gone = wait_until_gone(daemons)
        everything_gone = wait_until_gone(ray_processes)
    finally:
        driver.close()
    left = f"none: all {len(ray_processes)} Ray processes gone after {everything_gone - killed:.1f} s"
    record(
        FAULT_TABLE.format(backend=backend),
        **fault_row(
            "driver (which started its own local Ray) SIGKILLed mid-call",
            None,
            ranks_gone - killed,
            "-",
            f"n/a (driver gone); raylet and gcs_server gone after {daemons_gone - killed:.1f} s",
            left,
            **{"detected as": "actors and Ray exit by themselves"},
        ),
    )


def _is_core_daemon(pid: int) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"raylet" in cmdline.split(b"\0")[0] or b"gcs_server" in cmdline.split(b"\0")[0]


@pytest.mark.parametrize("backend", backend_params(("ray",)), indirect=True)
def test_a_detached_group_outlives_its_killed_driver(backend: str, tmp_path: Path, record: Any) -> None:
    import ray

    from dispatchcore.testing.workers import EchoWorker
    from executors_ray import attach_detached, kill_detached

    before = Snapshot.take(ray=True)
    name = f"faults-detached-{uuid.uuid4().hex[:8]}"
    driver = Driver(tmp_path, backend="ray", ray_address=ray.get_runtime_context().gcs_address, detached=name)
    try:
        ranks, kept = driver.info["ranks"], driver.info["detached"]
        killed = driver.kill()
        gone = wait_until_gone(ranks)
        assert all(alive(p) for p in kept), "the detached group went with its driver"
        with attach_detached(name, EchoWorker) as wg:  # another driver picks it up
            assert [i["pid"] for i in wg.info()] == kept
    finally:
        driver.close()
        killed_detached = kill_detached(name)
    assert killed_detached == 2
    leaks = settle(before, ray=True)
    record(
        FAULT_TABLE.format(backend=backend),
        **fault_row(
            "driver (on a running Ray) SIGKILLed mid-call, with a detached group",
            None,
            gone - killed,
            "-",
            "detached group: yes (attached and called from another driver)",
            leaks,
            **{"detected as": "its ordinary group's actors exit; the detached group stays"},
        ),
    )
    assert not leaks
