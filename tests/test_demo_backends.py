"""The demo runs the same loop to the same numbers on every backend."""

from __future__ import annotations

import math

import pytest

from dispatchcore import available_backends
from dispatchcore.demo import DemoConfig, StepMetrics, run_demo

STEPS = 3


def numbers(history: list[StepMetrics]) -> list[tuple[float, float, float]]:
    return [(m.reward, m.loss, m.kl) for m in history]


@pytest.fixture(scope="module")
def local_numbers() -> list[tuple[float, float, float]]:
    return numbers(run_demo(DemoConfig(backend="local", world_size=2, steps=STEPS)))


def assert_close(a: list[tuple[float, ...]], b: list[tuple[float, ...]]) -> None:
    assert len(a) == len(b)
    for row_a, row_b in zip(a, b, strict=True):
        for x, y in zip(row_a, row_b, strict=True):
            assert math.isclose(x, y, rel_tol=1e-4, abs_tol=1e-5), (a, b)


@pytest.mark.timeout(240)
def test_ray_matches_local(local_numbers: list[tuple[float, float, float]], request: pytest.FixtureRequest) -> None:
    if "ray" not in available_backends():
        pytest.skip("ray backend not available")
    request.getfixturevalue("ray_session")
    assert_close(numbers(run_demo(DemoConfig(backend="ray", world_size=2, steps=STEPS))), local_numbers)


@pytest.mark.timeout(240)
def test_torchrun_matches_local(local_numbers: list[tuple[float, float, float]]) -> None:
    if "torchrun" not in available_backends():
        pytest.skip("torchrun backend not available")
    assert_close(numbers(run_demo(DemoConfig(backend="torchrun", world_size=2, steps=STEPS))), local_numbers)


@pytest.mark.timeout(300)
def test_demo_under_real_torchrun_prints_the_local_numbers(local_numbers: list[tuple[float, float, float]]) -> None:
    if "torchrun" not in available_backends():
        pytest.skip("torchrun backend not available")
    import subprocess
    import sys

    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    done = subprocess.run(
        [*launch, "-m", "dispatchcore.demo", "--backend", "torchrun", "--steps", str(STEPS)],
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("dispatchcore demo:") == 1, "only the driver (rank 0) prints"
    rows = [line.split() for line in done.stdout.splitlines() if line.strip()[:1].isdigit()]
    printed = [(float(r[1]), float(r[2]), float(r[3])) for r in rows]
    assert len(printed) == STEPS
    for got, want in zip(printed, local_numbers, strict=True):
        assert got == pytest.approx((round(want[0], 3), round(want[1], 4), round(want[2], 4)), abs=2e-4)
