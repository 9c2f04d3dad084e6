"""pytest helpers for the ray backend: ``from executors_ray.testing import ray_session  # noqa: F401``."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

__all__ = ["TEST_NUM_CPUS", "ray_session"]

#: Logical CPUs of the test Ray (actors without a pool reserve none anyway).
TEST_NUM_CPUS = 4


@pytest.fixture(scope="session")
def ray_session() -> Iterator[Any]:
    """The ``ray`` module, initialised once per session on this machine only."""
    ray = pytest.importorskip("ray")
    started = not ray.is_initialized()
    if started:
        os.environ.pop("RAY_ADDRESS", None)  # never connect anywhere but here
        ray.init(
            address="local",  # a Ray of its own, even if another program runs one on this machine
            num_cpus=TEST_NUM_CPUS,
            include_dashboard=False,
            log_to_driver=False,
            namespace="dispatchcore-tests",
        )
    yield ray
    if started:
        ray.shutdown()
