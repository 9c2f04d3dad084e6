"""Test-run wide settings: Hypothesis profiles and the one local Ray per run."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
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


#: ``DISPATCHCORE_FULL=1`` runs every case.  Otherwise the core's tests run their ``multiprocess`` variants
#: only there: that backend is the example plugin (``examples/executor_plugin``), built on the same lane as
#: torchrun, and its own suite (conformance included) runs in every run; the CI run must stay under 20 minutes.
FULL = os.environ.get("DISPATCHCORE_FULL") == "1"
_PLUGIN_VARIANT = "multiprocess"
_HERE = Path(__file__).parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if FULL:
        return
    skip = pytest.mark.skip(reason=f"the {_PLUGIN_VARIANT!r} variant runs in the full run (DISPATCHCORE_FULL=1)")
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is None or not item.path.is_relative_to(_HERE):
            continue
        if any(isinstance(value, str) and value == _PLUGIN_VARIANT for value in callspec.params.values()):
            item.add_marker(skip)
