"""Reads an internal part (whether a rank applied the malloc setting): imports dispatchcore._wire._allocator on ranks.

Rank processes keep freed heap memory for reuse: large tensors stop re-faulting every step.
``Allocating.kept`` reads the allocator module's ``applied`` flag on each rank: no public name says
whether a rank's executor called :func:`dispatchcore.executor.keep_freed_memory`.
"""

from __future__ import annotations

import platform
import resource
import subprocess
import sys
import textwrap

import pytest
import torch

from dispatchcore import Dispatch, Worker, WorkerGroup, register
from dispatchcore.executor import keep_freed_memory

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc only")

#: Pages of the tensor one step makes: 48 MiB, above the largest size glibc ever serves from the heap
#: by default (it maps and unmaps each such tensor; smaller ones suffer when the heap top is trimmed).
STEP_PAGES = (48 << 20) // resource.getpagesize()


def faults_per_step() -> float:
    """Minor page faults per step of making and dropping the same large tensor (after warming up)."""

    def step() -> None:
        a = torch.ones(12 << 20)
        del a

    for _ in range(3):
        step()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(20):
        step()
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 20


class Allocating(Worker):
    @register(Dispatch.ONE_TO_ALL)
    def kept(self) -> bool:
        from dispatchcore._wire import _allocator

        return _allocator.applied


def run_fresh(code: str, env: dict[str, str] | None = None) -> str:
    """``code`` in a new interpreter (malloc settings are per process: never this test process's)."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120, env=env
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


PROBE = """
    import sys
    sys.path[:0] = {path!r}
    from test_keep_freed_memory import faults_per_step
    from dispatchcore.executor import keep_freed_memory
    applied = {apply} and keep_freed_memory()
    print(applied, faults_per_step())
"""


def test_freed_tensors_are_reused_instead_of_refaulted() -> None:
    path = [str(p) for p in sys.path if p] + [__file__.rsplit("/", 1)[0]]
    applied, kept = run_fresh(PROBE.format(path=path, apply=True)).split()
    _, default = run_fresh(PROBE.format(path=path, apply=False)).split()
    assert applied == "True"
    assert float(default) > STEP_PAGES / 2  # glibc maps them fresh every step
    assert float(kept) < STEP_PAGES / 10


def test_off_when_asked_or_when_the_user_tuned_malloc() -> None:
    assert keep_freed_memory(environ={"DISPATCHCORE_KEEP_FREED_MB": "0"}) is False
    assert keep_freed_memory(environ={"MALLOC_TRIM_THRESHOLD_": "131072"}) is False
    assert keep_freed_memory(environ={"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=131072"}) is False


def test_a_bad_setting_names_the_variable() -> None:
    with pytest.raises(ValueError, match="DISPATCHCORE_KEEP_FREED_MB must be a whole number of MiB"):
        keep_freed_memory(environ={"DISPATCHCORE_KEEP_FREED_MB": "lots"})


# What the ranks' page faults become is load- and arena-dependent (which thread's arena glibc hands a
# method, how often it trims): ``python -m benchmarks.keep_freed_memory`` measures it.  Here, only what
# holds on any machine: each rank applied the setting when it started.


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_self_started_torchrun_ranks_keep_freed_memory() -> None:
    with WorkerGroup(Allocating, 2, backend="torchrun") as group:
        assert group.kept() == [True, True]


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.usefixtures("ray_session")
def test_ray_actors_keep_freed_memory() -> None:
    with WorkerGroup(Allocating, 2, backend="ray") as group:
        assert group.kept() == [True, True]
