"""The conformance suite on the ray backend (one local Ray for the whole run)."""

from __future__ import annotations

import pytest

pytest.importorskip("ray")

from dispatchcore.testing.conformance import ExecutorConformance  # noqa: E402
from executors_ray.testing import ray_session  # noqa: E402, F401

pytestmark = [pytest.mark.usefixtures("ray_session"), pytest.mark.timeout(120)]


class TestRayConformance(ExecutorConformance):
    backend = "ray"
    ranks_are_processes = True
