"""``mypy --strict src`` is clean: the package ships ``py.typed``, so its own annotations must hold.

The settings are the project's (``[tool.mypy]`` in ``pyproject.toml``); a
fresh cache per run, so a stale one never hides an error.  A missing mypy
fails the test (it is in the ``test`` extra), it never skips.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(300)


def test_mypy_strict_reports_no_error_in_src(tmp_path: Path) -> None:
    if importlib.util.find_spec("mypy") is None:
        pytest.fail("mypy is not installed; install the test extra: pip install -e '.[test]' -c constraints.txt")
    command = [
        sys.executable, "-m", "mypy", "--strict", "--config-file", str(ROOT / "pyproject.toml"),
        "--cache-dir", str(tmp_path / "mypy-cache"), "--no-color-output", "src",
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=280)
    assert result.returncode == 0, f"mypy --strict src found errors:\n{result.stdout[-6000:]}\n{result.stderr[-2000:]}"
    assert "Success" in result.stdout, result.stdout
