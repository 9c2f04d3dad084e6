"""Page faults per step of a 48 MiB tensor made and dropped, with and without ``keep_freed_memory``.

Run ``python -m benchmarks.keep_freed_memory [--backends torchrun,ray]``.  Load-dependent (how often glibc
trims, which arena a thread gets), so measured here rather than asserted in tests: the tests check only
that each rank applied the setting (``tests/test_keep_freed_memory.py``).  Rows: a fresh process with the
setting off and on, then each backend's ranks (which apply it when they start).
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import textwrap

import torch
from benchmarks._common import print_table

from dispatchcore import Dispatch, Worker, WorkerGroup, register

#: Pages of the tensor one step makes (48 MiB): above every size glibc serves from the heap by default.
STEP_PAGES = (48 << 20) // resource.getpagesize()


def faults_per_step(steps: int = 20) -> float:
    """Minor page faults per step of making and dropping the same large tensor (after warming up)."""
    for _ in range(3):
        torch.ones(12 << 20)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(steps):
        torch.ones(12 << 20)
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / steps


class Allocating(Worker):
    @register(Dispatch.ONE_TO_ALL)
    def faults(self) -> float:
        return faults_per_step()


def _fresh(apply: bool) -> float:
    code = f"""
        import sys
        sys.path[:0] = {sys.path!r}
        from benchmarks.keep_freed_memory import faults_per_step
        from dispatchcore.executor import keep_freed_memory
        {apply} and keep_freed_memory()
        print(faults_per_step())
    """
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, check=True)
    return float(out.stdout.strip())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--backends", default="torchrun,ray")
    args = parser.parse_args()
    rows: list[list[object]] = [
        ["fresh process, default malloc", _fresh(False), STEP_PAGES],
        ["fresh process, keep_freed_memory()", _fresh(True), STEP_PAGES],
    ]
    for backend in [b for b in args.backends.split(",") if b]:
        if backend == "ray":
            import ray

            ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
            os.environ.setdefault("RAY_DEDUP_LOGS", "0")
        with WorkerGroup(Allocating, 2, backend=backend) as group:
            group.faults()  # a fresh rank's first large tensors map fresh memory: warm up
            for rank, faults in enumerate(group.faults()):
                rows.append([f"{backend} rank {rank}", faults, STEP_PAGES])
    print_table("Page faults per 48 MiB step", ["where", "faults per step", "pages per step"], rows)


if __name__ == "__main__":
    main()
