"""``dispatchcore bench``: run each executor's benchmark from the source tree's ``benchmarks/``.

It needs a source checkout (an editable install): the benchmarks are not in the installed package.
"""

from __future__ import annotations

import contextlib
import datetime
import importlib
import io
import os
import platform
import sys
from pathlib import Path
from typing import TextIO

from .._spi import available_backends

BENCHMARKS = {"local": "bench_local.py", "ray": "bench_ray.py", "torchrun": "bench_torchrun.py"}
#: Run first, whatever is selected: the driver-side cost every executor pays (a null executor; seconds).
CORE = "bench_core.py"
#: Run after the per-executor ones, on the selected executors that are available (eager vs lazy chain).
ACROSS_BACKENDS = "bench_chain.py"
#: The line of a docs page after which ``--out`` writes this run's tables (``docs/benchmarks.md``).
TABLES_MARKER = "<!-- bench-tables -->"


def benchmarks_dir() -> Path | None:
    """``benchmarks/`` of the checkout this package was installed from, if any."""
    for parent in Path(__file__).resolve().parents:
        candidate = parent / "benchmarks"
        if (candidate / "bench_local.py").exists():
            return candidate
    return None


class _Tee(io.StringIO):
    """Keeps what is printed while still printing it."""

    def __init__(self, through: TextIO) -> None:
        super().__init__()
        self.through = through

    def write(self, text: str) -> int:
        self.through.write(text)
        return super().write(text)


def machine() -> str:
    """One line naming what the numbers were measured on."""
    import torch

    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    ray = sys.modules.get("ray")
    ray_version = f", Ray {ray.__version__}" if ray is not None else ""
    return (
        f"{platform.platform()}, {os.cpu_count()} CPU cores, {memory:.0f} GiB, {gpu}; "
        f"Python {platform.python_version()}, torch {torch.__version__}{ray_version}"
    )


def write_tables(page: Path, tables: str, command: str) -> None:
    """Replace what follows the page's ``TABLES_MARKER`` line with this run's tables, dated, with the machine."""
    text = page.read_text() if page.exists() else f"# Benchmarks\n\n{TABLES_MARKER}\n"
    head = text.split(TABLES_MARKER)[0]
    today = datetime.datetime.now(datetime.UTC).date().isoformat()
    intro = f"## Tables\n\nMeasured on {today} with `{command}` on {machine()}.\n"
    page.write_text(f"{head}{TABLES_MARKER}\n{intro}{tables}")


def run_benchmarks(quick: bool = False, only: list[str] | None = None, out: Path | None = None) -> int:
    """Run the benchmarks, printing their tables; with ``out``, also write them into that page (dated)."""
    if out is None:
        return _run(quick, only)
    tee = _Tee(sys.stdout)
    with contextlib.redirect_stdout(tee):
        status = _run(quick, only)
    command = " ".join(["dispatchcore bench", *(["--quick"] if quick else []), *(f"--only {b}" for b in only or [])])
    write_tables(out, tee.getvalue(), command)
    return status


def _run(quick: bool, only: list[str] | None) -> int:
    folder = benchmarks_dir()
    if folder is None:
        print(
            "dispatchcore bench needs the source tree's benchmarks/ folder: run it from a checkout "
            "installed with `pip install -e .`",
            file=sys.stderr,
        )
        return 2
    sys.path.insert(0, str(folder))
    status = 0
    quick_args = ["--quick"] if quick else []
    importlib.import_module(Path(CORE).stem).main(quick_args)
    for backend in only or list(BENCHMARKS):
        if backend not in available_backends():
            print(f"\n### {backend}: skipped (backend not available here; see `dispatchcore backends`)")
            continue
        # Imported under its own name from a folder on sys.path (which spawned
        # ranks inherit), so worker classes defined there load in every rank.
        code = importlib.import_module(Path(BENCHMARKS[backend]).stem).main(quick_args)
        status = status or int(code or 0)
    selected = [backend for backend in only or list(BENCHMARKS) if backend in available_backends()]
    if selected:
        code = importlib.import_module(Path(ACROSS_BACKENDS).stem).main([*quick_args, "--backends", *selected])
        status = status or int(code or 0)
    return status
