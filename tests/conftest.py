"""Test-run wide settings: Hypothesis profiles and the one local Ray per run."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

# CI machines are 2 shared cores: no per-example deadline, fewer examples.
settings.register_profile("ci", deadline=None, max_examples=25, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", deadline=None)
settings.load_profile("ci" if os.environ.get("CI") else os.environ.get("HYPOTHESIS_PROFILE", "dev"))

# ``ray_session`` (session scope) starts one local Ray for every test that asks for it.
try:
    from executors_ray.testing import ray_session  # noqa: F401
except ImportError:  # the ray executor package is absent: its tests skip
    pass
