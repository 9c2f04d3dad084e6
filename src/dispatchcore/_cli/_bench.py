"""``dispatchcore bench``: run each executor's benchmark from the source tree's ``benchmarks/``.

It needs a source checkout (an editable install): the benchmarks are not in the installed package.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

from .._spi import available_backends

BENCHMARKS = {"local": "bench_local.py", "ray": "bench_ray.py", "torchrun": "bench_torchrun.py"}
#: Run first, whatever is selected: the driver-side cost every executor pays (a null executor; seconds).
CORE = "bench_core.py"
#: Run after the per-executor ones, on the selected executors that are available (eager vs lazy chain).
ACROSS_BACKENDS = "bench_chain.py"


def benchmarks_dir() -> Path | None:
    """``benchmarks/`` of the checkout this package was installed from, if any."""
    for parent in Path(__file__).resolve().parents:
        candidate = parent / "benchmarks"
        if (candidate / "bench_local.py").exists():
            return candidate
    return None


def run_benchmarks(quick: bool = False, only: list[str] | None = None) -> int:
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
