"""The console script: an expected error is one line on stderr and a non-zero exit, never a traceback.

Also: the demo times start-up and training apart (a step is milliseconds,
start-up seconds).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from dispatchcore.demo.loop import main

#: Runs the console script's module as ``python -m`` would, after an optional patch (a missing extra).
_RUN_CLI = "import runpy, sys; {patch}; sys.argv = ['dispatchcore', *sys.argv[1:]]; " + (
    "runpy.run_module('dispatchcore._cli', run_name='__main__')"
)

#: Runs the console script's module once per command line (a JSON list on stdin) in one interpreter, each as
#: ``python -m`` would, and prints each one's exit status, stdout and stderr: one start-up (torch's import) for all.
_RUN_EACH = """
import contextlib, io, json, runpy, sys
results = []
for argv in json.load(sys.stdin):
    out, err, code = io.StringIO(), io.StringIO(), 0
    sys.argv = ["dispatchcore", *argv]
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            runpy.run_module("dispatchcore._cli", run_name="__main__")
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
    results.append([code, out.getvalue(), err.getvalue()])
print(json.dumps(results))
"""


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "DISPATCHCORE_TRACEBACK"}


def run_cli(*argv: str, patch: str = "pass") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _RUN_CLI.format(patch=patch), *argv],
        capture_output=True,
        text=True,
        timeout=120,
        env=_clean_env(),
    )


def run_each(*commands: list[str]) -> list[subprocess.CompletedProcess[str]]:
    """Each command line's outcome, as ``run_cli`` gives it, from one interpreter."""
    done = subprocess.run(
        [sys.executable, "-c", _RUN_EACH],
        input=json.dumps(commands),
        capture_output=True,
        text=True,
        timeout=120,
        env=_clean_env(),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    pairs = zip(commands, results, strict=True)
    return [subprocess.CompletedProcess(argv, code, out, err) for argv, (code, out, err) in pairs]


def assert_one_line(result: subprocess.CompletedProcess[str], *fragments: str) -> str:
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert result.stdout == ""
    for fragment in fragments:
        assert fragment in lines[0]
    return lines[0]


def test_an_unknown_backend_is_one_line_naming_the_available_ones() -> None:
    names = ["lcoal", "Ray"]
    results = run_each(*(["demo", "--backend", name, "--steps", "1"] for name in names))
    for name, result in zip(names, results, strict=True):
        line = assert_one_line(result, repr(name), "available backends")
        assert line.startswith("dispatchcore: error: ")


def test_a_missing_extra_is_one_line_with_the_pip_command() -> None:
    patch = "from executors_ray import RayExecutor; RayExecutor.requires = ('dispatchcore_test_no_such_module',)"
    assert_one_line(run_cli("demo", "--backend", "ray", "--steps", "1", patch=patch), "pip install", "'ray'")


def test_bad_arguments_are_one_line_pointing_at_help() -> None:
    cases = [
        (["demo", "--steps", "0"], "--steps: must be at least 1, got 0"),
        (["demo", "--world-size", "two"], "--world-size: expected a whole number, got 'two'"),
        (["demo", "--no-such-flag"], "unrecognized arguments: --no-such-flag"),
        (["demoo"], "invalid choice: 'demoo'"),
    ]
    for (_, fragment), result in zip(cases, run_each(*(argv for argv, _ in cases)), strict=True):
        assert_one_line(result, fragment, "--help)")


def test_the_traceback_is_there_when_asked_for() -> None:
    result = subprocess.run(
        [sys.executable, "-c", _RUN_CLI.format(patch="pass"), "demo", "--backend", "lcoal"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "DISPATCHCORE_TRACEBACK": "1"},
    )
    assert result.returncode != 0 and "Traceback" in result.stderr and "BackendNotFoundError" in result.stderr


def test_the_demo_prints_start_up_and_step_time_apart(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--backend", "local", "--steps", "2"]) == 0
    summary = capsys.readouterr().out.strip().splitlines()[-1]
    found = re.fullmatch(
        r"reward [\d.]+ -> [\d.]+; start-up ([\d.]+)s, 2 steps in ([\d.]+)s \(([\d.]+) ms a step, median\), "
        r"shutdown ([\d.]+)s",
        summary,
    )
    assert found, summary
    start_up, training, per_step, _ = (float(g) for g in found.groups())
    # The step time is a median of the steps alone: never more than the training time it is part of.
    assert per_step / 1e3 <= training + 0.01
    assert start_up >= 0
