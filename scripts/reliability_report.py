#!/usr/bin/env python
"""Run the fault suites and write RELIABILITY.md from the figures they record.

    python scripts/reliability_report.py              # full run (every case), writes RELIABILITY.md
    python scripts/reliability_report.py --quick      # CI's subset of cases
    python scripts/reliability_report.py --from rows.jsonl   # render recorded rows, run nothing
    python scripts/reliability_report.py -- -k ray    # extra arguments go to pytest
    python scripts/reliability_report.py --update -- -k test_failed_step   # re-measure some rows, keep the rest

Tests record rows with the ``record(table, **row)`` fixture of
``tests/faults/conftest.py`` (one JSON line per row in
``$DISPATCHCORE_RELIABILITY_OUT``).  Every table is rendered the same way:
one markdown table per table name, its columns the rows' keys in the order
they first appear, so a new suite's figures need no change here.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
#: Table families first in this order, then any other, by name; backends likewise.
FAMILIES = ("faults", "bad_input", "bad-input", "soak", "replace")
BACKENDS = ("local", "ray", "torchrun", "multiprocess")
#: Values of a ``leaks`` cell that mean nothing was left behind (so does any starting with "none").
NO_LEAK = {"-", "", "0", "{}"}


def run_suite(out: Path, full: bool, pytest_args: list[str]) -> tuple[int, str, float]:
    """Run ``pytest tests/faults`` recording into ``out``; (exit code, its summary lines, seconds)."""
    env = {**os.environ, "DISPATCHCORE_RELIABILITY_OUT": str(out)}
    env.pop("DISPATCHCORE_FAULTS_FULL", None)
    if full:
        env["DISPATCHCORE_FAULTS_FULL"] = "1"
    command = [sys.executable, "-m", "pytest", "tests/faults", "-q", "-rfE", "--durations=10", *pytest_args]
    print("running:", " ".join(command), flush=True)
    started = time.monotonic()
    proc = subprocess.run(command, cwd=ROOT, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # noqa: S603
    seconds = time.monotonic() - started
    sys.stdout.write(proc.stdout[-6000:])
    return proc.returncode, _summary(proc.stdout), seconds


def _summary(output: str) -> str:
    """The pytest lines worth keeping: failures and the final count."""
    keep = [line for line in output.splitlines() if line.startswith(("FAILED", "ERROR"))]
    counts = [line for line in output.splitlines() if re.search(r"\d+ (passed|failed|error)", line)]
    if counts:
        keep.append(counts[-1].strip("= "))
    return "\n".join(keep)


def read_rows(path: Path) -> dict[str, list[dict[str, Any]]]:
    """Rows by table name, in the order recorded."""
    tables: dict[str, list[dict[str, Any]]] = {}
    if not path.exists():
        return tables
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        tables.setdefault(str(row.pop("table", "untitled")), []).append(row)
    return tables


def read_report(path: Path) -> dict[str, list[dict[str, Any]]]:
    """The tables of a report this script wrote, each row's cells as their text (what ``--update`` keeps)."""
    tables: dict[str, list[dict[str, Any]]] = {}
    rows: list[dict[str, Any]] = []
    columns: list[str] = []
    for line in path.read_text().splitlines() if path.exists() else []:
        if line.startswith("## "):
            rows, columns = tables.setdefault(line[3:], []), []
        elif line.startswith("| ") and line.endswith(" |"):
            cells = [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line[2:-2])]
            if not columns:
                columns = cells
            elif set(cells) != {"---"}:
                rows.append(dict(zip(columns, cells, strict=False)))
    return tables


def merge_rows(kept: dict[str, list[dict[str, Any]]], fresh: dict[str, list[dict[str, Any]]]) -> int:
    """Put ``fresh`` rows into ``kept``: a row replaces the one of its table with the same fault; how many."""
    for name, rows in fresh.items():
        table = kept.setdefault(name, [])
        for row in rows:
            same = [i for i, old in enumerate(table) if old.get("fault") == row.get("fault")]
            if same:
                table[same[0]] = row
            else:
                table.append(row)
    return sum(len(rows) for rows in fresh.values())


def _table_key(name: str) -> tuple[int, str, int, str]:
    family, _, rest = name.partition("/")
    first = rest.split("/")[0]
    f = FAMILIES.index(family) if family in FAMILIES else len(FAMILIES)
    b = BACKENDS.index(first) if first in BACKENDS else len(BACKENDS)
    return (f, family, b, name)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        text = _number(value)
    elif isinstance(value, (list, tuple)):
        text = ", ".join(_cell(v) for v in value)
    elif isinstance(value, dict):
        text = "; ".join(f"{k}: {_cell(v)}" for k, v in value.items()) or "-"
    else:
        text = str(value)
    return text.replace("|", "\\|").replace("\n", " ")


def _number(value: float) -> str:
    """Seconds to the millisecond, larger figures with fewer decimals, whole numbers without any."""
    if value.is_integer() and value:
        return str(int(value))
    size = abs(value)
    return f"{value:.0f}" if size >= 100 else f"{value:.1f}" if size >= 10 else f"{value:.3f}"


def render_table(rows: list[dict[str, Any]]) -> list[str]:
    """A markdown table: the rows' keys (first-seen order) as columns."""
    columns: list[str] = []
    for row in rows:
        columns += [k for k in row if k not in columns]
    lines = ["| " + " | ".join(_cell(c) for c in columns) + " |", "|" + " --- |" * len(columns)]
    lines += ["| " + " | ".join(_cell(row.get(c)) for c in columns) + " |" for row in rows]
    return lines


def leak_rows(tables: dict[str, list[dict[str, Any]]]) -> list[str]:
    """``table: fault`` of every row whose ``leaks`` cell names something left behind."""
    found = []
    for name, rows in tables.items():
        for row in rows:
            leaks = row.get("leaks")
            text = str(leaks).strip().lower()
            if leaks is not None and text not in NO_LEAK and not text.startswith("none"):
                found.append(f"{name}: {row.get('fault', row)} -> {leaks}")
    return found


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def machine() -> list[str]:
    """Where the figures were taken: cores, memory, versions, commit."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    ram = "?"
    try:
        kib = int(Path("/proc/meminfo").read_text().split("MemTotal:")[1].split()[0])
        ram = f"{kib / 2**20:.1f} GiB"
    except (OSError, IndexError, ValueError):
        pass
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    commit = _git("rev-parse", "--short", "HEAD")
    # the report itself does not count as a change
    changed = _git("status", "--porcelain", "--untracked-files=no", "--", ".", ":!docs/RELIABILITY.md")
    dirty = " (with uncommitted changes)" if changed else ""
    return [
        f"- Machine: {usable} usable cores ({os.cpu_count()} logical; {cpu}), {ram} RAM, "
        f"{platform.system()} {platform.release()}",
        f"- Python {platform.python_version()}, torch {_version('torch')}, ray {_version('ray')}, "
        f"dispatchcore {_version('dispatchcore')}",
        f"- Commit: {commit or '?'}{dirty}",
    ]


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()  # noqa: S603, S607
    except (OSError, subprocess.CalledProcessError):
        return ""


def write_report(
    path: Path,
    tables: dict[str, list[dict[str, Any]]],
    *,
    run: str,
    summary: str,
    exit_code: int | None,
) -> None:
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# Reliability",
        "",
        "Generated by `python scripts/reliability_report.py` from the figures the fault suites",
        "record (`tests/faults/`); do not edit by hand.  Times are measured, never asserted:",
        "the tests prove each bound structurally (for example, the surviving rank computes",
        "for an hour, far past the test's timeout, so only a prompt detection passes).",
        "A time to detect a death runs from the moment the rank's process is seen gone (for a",
        "rank that died idle, from the start of the next call); a Ctrl-C's, from the signal.",
        "CI runs a subset of these cases (`--quick`); this report runs them all.",
        "",
        f"- Date: {now}",
        *machine(),
        f"- Run: {run}",
    ]
    if summary:
        lines += ["- pytest: " + summary.splitlines()[-1]]
        failures = summary.splitlines()[:-1]
        if failures:
            lines += ["", "Failures:", "", *(f"    {f}" for f in failures)]
    if exit_code not in (0, None):
        lines += ["", f"**The suite did not pass (pytest exit code {exit_code}).**"]
    leaks = leak_rows(tables)
    lines += [
        "",
        f"Rows: {sum(len(r) for r in tables.values())} in {len(tables)} tables; "
        f"rows with something left behind: {len(leaks)}.",
    ]
    lines += [f"- {leak}" for leak in leaks]
    for name in sorted(tables, key=_table_key):
        lines += ["", f"## {name}", "", *render_table(tables[name])]
    path.write_text("\n".join(lines) + "\n")


def main(argv: Iterable[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "RELIABILITY.md", help="report to write")
    parser.add_argument("--quick", action="store_true", help="CI's subset of cases (no DISPATCHCORE_FAULTS_FULL)")
    parser.add_argument("--from", dest="source", type=Path, help="render these recorded rows; run nothing")
    parser.add_argument("--rows", type=Path, help="also keep the recorded rows (JSON lines) here")
    parser.add_argument(
        "--update", action="store_true", help="keep the report's other rows; replace or add only those this run records"
    )
    parser.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    args = parser.parse_args(list(argv) if argv is not None else None)
    if args.source is not None:
        write_report(args.out, read_rows(args.source), run=f"rows from {args.source}", summary="", exit_code=None)
        print(f"wrote {args.out}")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        rows = args.rows or Path(tmp) / "rows.jsonl"
        rows.unlink(missing_ok=True)
        code, summary, seconds = run_suite(rows, full=not args.quick, pytest_args=args.pytest_args)
        kind = "CI subset (--quick)" if args.quick else "full (DISPATCHCORE_FAULTS_FULL=1)"
        extra = f", pytest {' '.join(args.pytest_args)}" if args.pytest_args else ""
        run = f"{kind}{extra}; `pytest tests/faults` took {seconds:.0f} s"
        tables = read_rows(rows)
        if args.update:
            kept = read_report(args.out)
            count = merge_rows(kept, tables)
            tables = kept
            run = f"update: {count} rows re-measured ({run}); the others as the last full run measured them"
        write_report(
            args.out,
            tables,
            run=run,
            summary=summary,
            exit_code=code,
        )
    print(f"wrote {args.out}")
    return code


if __name__ == "__main__":
    sys.exit(main())
