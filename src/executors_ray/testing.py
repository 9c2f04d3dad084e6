"""pytest helpers for the ray backend: one local Ray per test run.

Import the fixture into a test module (``from executors_ray.testing import
ray_session  # noqa: F401``) and depend on it.  Start-up costs ~5-15 s, so every module shares one Ray;
it is shut down at the end of the session only if this fixture started it.

Worker classes for tests belong in the tests themselves: a class defined in
a test module reaches the actors by value (``dispatchcore.wire``), so it
need not live in an installed package.
"""

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
    started = False
    if not ray.is_initialized():
        os.environ.pop("RAY_ADDRESS", None)  # never connect anywhere but here
        ray.init(
            address="local",  # a Ray of its own, even if another program runs one on this machine
            num_cpus=TEST_NUM_CPUS,
            include_dashboard=False,
            log_to_driver=False,
            namespace="dispatchcore-tests",
        )
        started = True
    yield ray
    if started:
        ray.shutdown()
