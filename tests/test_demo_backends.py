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
