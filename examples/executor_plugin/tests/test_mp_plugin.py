"""The example is found as a plugin, uses public names only, and its ranks outlive no driver."""

from __future__ import annotations

import ast
import importlib.metadata
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dispatchcore import available_backends

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "dispatchcore_mp_executor"

DRIVER = """
import json, os, time
from dispatchcore import Dispatch, Worker, WorkerGroup, register

class Probe(Worker):  # defined in the driver script: travels by value
    @register(Dispatch.ONE_TO_ALL)
    def probe(self):
        return os.getpid(), os.environ["RANK"], os.environ.get("EXAMPLE_VAR")

if __name__ == "__main__":  # spawned ranks import this script too
    wg = WorkerGroup(Probe, 2, backend="multiprocess", env={"EXAMPLE_VAR": "set"})
    print(json.dumps(wg.probe()), flush=True)
    time.sleep(600)
"""


def test_registered_through_the_entry_point() -> None:
    entry = {ep.name: ep.value for ep in importlib.metadata.entry_points(group="dispatchcore")}
    assert entry.get("multiprocess") == "dispatchcore_mp_executor.plugin"
    assert "multiprocess" in available_backends()


def test_imports_only_public_dispatchcore_names() -> None:
    for path in PACKAGE.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules, names = [node.module], [a.name for a in node.names]
            elif isinstance(node, ast.Import):
                modules, names = [a.name for a in node.names], []
            else:
                continue
            for module in modules:
                if module.split(".")[0] == "dispatchcore":
                    private = [p for p in [*module.split("."), *names] if p.startswith("_")]
                    assert not private, f"{path.name} imports private {module}: {private}"


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state in ("Z", "X")  # a zombie has exited; only its parent entry remains


@pytest.mark.slow
@pytest.mark.timeout(90)
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_ranks_exit_when_the_driver_dies(tmp_path: Path) -> None:
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    with subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, cwd=tmp_path) as driver:
        assert driver.stdout is not None
        line = driver.stdout.readline()
        assert line, f"the driver failed (exit code {driver.wait()})"
        probes = json.loads(line)
        assert [(rank, var) for _, rank, var in probes] == [("0", "set"), ("1", "set")]
        pids = [pid for pid, _, _ in probes]
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait()
    deadline = time.monotonic() + 10
    while not all(_gone(pid) for pid in pids):
        assert time.monotonic() < deadline, f"rank processes {pids} outlived their driver"
        time.sleep(0.1)
