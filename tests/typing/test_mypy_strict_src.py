"""``mypy --strict src`` is clean: the package ships ``py.typed``, so its own annotations must hold.

The settings are the project's (``[tool.mypy]`` in ``pyproject.toml``); a
fresh cache per run, so a stale one never hides an error.  A missing mypy
fails the test (it is in the ``test`` extra), it never skips.  mypy runs
beside the tests collected before this one (``start_beside_the_run``, called by
``tests/conftest.py`` once collection ends): 25 s of one core that a 2-core
CI machine mostly has spare.
"""

from __future__ import annotations

import atexit
import importlib.util
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import IO

import pytest

ROOT = Path(__file__).resolve().parents[2]
MYPY_TIMEOUT_S = 280

pytestmark = pytest.mark.timeout(MYPY_TIMEOUT_S + 20)

#: The run started for this session: (process, its output file, its cache folder).
_started: list[tuple[subprocess.Popen[bytes], IO[bytes], str]] = []


def start_beside_the_run() -> None:
    """Start ``mypy --strict src`` now (once); the test collects its verdict."""
    if _started or importlib.util.find_spec("mypy") is None:
        return
    cache = tempfile.mkdtemp(prefix="dispatchcore-mypy-")
    command = [
        sys.executable, "-m", "mypy", "--strict", "--config-file", str(ROOT / "pyproject.toml"),
        "--cache-dir", cache, "--no-color-output", "src",
    ]  # fmt: skip
    out = tempfile.TemporaryFile()
    process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, stdin=subprocess.DEVNULL)
    atexit.register(process.kill)  # a run that ends early leaves no mypy behind
    _started.append((process, out, cache))


def test_mypy_strict_reports_no_error_in_src() -> None:
    if importlib.util.find_spec("mypy") is None:
        pytest.fail("mypy is not installed; install the test extra: pip install -e '.[test]' -c constraints.txt")
    start_beside_the_run()  # a no-op unless this test runs alone (-k, a node id)
    process, out, cache = _started[0]
    try:
        code = process.wait(timeout=MYPY_TIMEOUT_S)
    finally:
        process.kill()
        shutil.rmtree(cache, ignore_errors=True)
    out.seek(0)
    text = out.read().decode(errors="replace")
    assert code == 0, f"mypy --strict src found errors:\n{text[-8000:]}"
    assert "Success" in text, text
