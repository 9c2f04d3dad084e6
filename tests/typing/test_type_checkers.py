"""mypy and pyright on ``typed_driver.py``: correct calls pass, each marked wrong line is reported.

A line ending in ``# expect: mypy=<code> pyright=<rule>`` must give exactly
that error in each checker, and no other line may give any.  A missing
checker fails the test (they are in the ``test`` extra), it never skips.
Both checkers start once, side by side, for the whole module.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
SAMPLE = HERE / "typed_driver.py"
#: Check this checkout's dispatchcore, whatever copy is installed.
SRC = HERE.parents[1] / "src"
EXPECT = re.compile(r"# expect: mypy=(\S+) pyright=(\S+)\s*$")
MYPY_LINE = re.compile(
    r"^(?P<path>[^:]+):(?P<line>\d+): (?P<severity>error|warning): (?P<message>.*?)\s+\[(?P<code>[\w-]+)\]$"
)

pytestmark = pytest.mark.timeout(240)


def expected() -> dict[str, set[tuple[int, str]]]:
    """(line, code) each checker must report, read off the sample's markers."""
    found: dict[str, set[tuple[int, str]]] = {"mypy": set(), "pyright": set()}
    for number, text in enumerate(SAMPLE.read_text().splitlines(), start=1):
        match = EXPECT.search(text)
        if match:
            found["mypy"].add((number, match.group(1)))
            found["pyright"].add((number, match.group(2)))
    return found


def _require(module: str) -> None:
    if importlib.util.find_spec(module) is None:
        pytest.fail(
            f"{module} is not installed, so the typed-driver check cannot run; install the test extra: "
            "pip install -e '.[test]' -c constraints.txt"
        )


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, subprocess.Popen[str]]]:
    _require("mypy")
    _require("pyright")
    scratch = tmp_path_factory.mktemp("type-checkers")
    pyright_config = scratch / "pyrightconfig.json"
    pyright_config.write_text(json.dumps({"extraPaths": [str(SRC)], "pythonVersion": "3.11"}))
    commands = {
        "mypy": [
            sys.executable, "-m", "mypy", "--config-file", str(HERE / "mypy.ini"),
            "--cache-dir", str(scratch / "mypy-cache"),
            "--no-error-summary", "--hide-error-context", "--show-error-codes", str(SAMPLE),
        ],
        "pyright": [
            sys.executable, "-m", "pyright", "--outputjson", "--pythonpath", sys.executable,
            "--project", str(pyright_config), str(SAMPLE),
        ],
    }  # fmt: skip
    env = {**os.environ, "MYPYPATH": str(SRC)}
    procs = {
        name: subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=HERE, env=env)
        for name, cmd in commands.items()
    }
    yield procs
    for proc in procs.values():
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _finish(proc: subprocess.Popen[str]) -> tuple[str, str]:
    out, err = proc.communicate(timeout=200)
    return out, err


def _compare(checker: str, reported: dict[tuple[int, str], str]) -> None:
    want = expected()[checker]
    lines = SAMPLE.read_text().splitlines()
    missing = [f"  line {n} ({code}): {lines[n - 1].strip()}" for n, code in sorted(want - set(reported))]
    extra = [
        f"  line {n} [{code}]: {message}" for (n, code), message in sorted(reported.items()) if (n, code) not in want
    ]
    assert not missing and not extra, (
        f"{checker} disagrees with the markers in {SAMPLE.name}:\n"
        + ("not reported:\n" + "\n".join(missing) + "\n" if missing else "")
        + ("reported but not expected:\n" + "\n".join(extra) if extra else "")
    )
    assert len(want) >= 15, "the sample lost its wrong calls"


def test_mypy_accepts_correct_calls_and_reports_wrong_ones(runs: dict[str, subprocess.Popen[str]]) -> None:
    out, err = _finish(runs["mypy"])
    reported: dict[tuple[int, str], str] = {}
    for text in out.splitlines():
        match = MYPY_LINE.match(text)
        if match:
            assert Path(match["path"]).name == SAMPLE.name, f"mypy reports an error outside the sample: {text}"
            reported[(int(match["line"]), match["code"])] = match["message"]
        elif ": note: " not in text and text.strip():
            pytest.fail(f"unexpected mypy output line: {text!r}\nstderr: {err}")
    assert runs["mypy"].returncode in (0, 1), f"mypy crashed (exit {runs['mypy'].returncode}):\n{out}\n{err}"
    _compare("mypy", reported)


def test_pyright_accepts_correct_calls_and_reports_wrong_ones(runs: dict[str, subprocess.Popen[str]]) -> None:
    out, err = _finish(runs["pyright"])
    try:
        report = json.loads(out)
    except json.JSONDecodeError:
        pytest.fail(
            f"pyright gave no JSON report (exit {runs['pyright'].returncode}); is node available?\n{out}\n{err}"
        )
    reported: dict[tuple[int, str], str] = {}
    for diag in report["generalDiagnostics"]:
        if diag["severity"] not in ("error", "warning"):
            continue
        assert Path(diag["file"]).name == SAMPLE.name, f"pyright reports outside the sample: {diag}"
        reported[(diag["range"]["start"]["line"] + 1, diag.get("rule", "<no rule>"))] = diag["message"]
    _compare("pyright", reported)
