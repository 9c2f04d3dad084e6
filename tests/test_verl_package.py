"""``executors_ray.verl`` holds verl's adapter; ``executors_ray`` re-exports it and stays free of ray at import."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import executors_ray
import executors_ray.testing
import executors_ray.verl

SRC = Path(__file__).resolve().parent.parent / "src"


@pytest.mark.parametrize("name", executors_ray.verl.__all__)
def test_every_verl_name_is_the_same_object_from_executors_ray(name: str) -> None:
    assert getattr(executors_ray, name) is getattr(executors_ray.verl, name)


def test_the_adapter_lives_in_the_verl_package() -> None:
    assert executors_ray.RayWorkerGroup.__module__.startswith("executors_ray.verl.")
    assert executors_ray.ResourcePoolManager.__module__.startswith("executors_ray.verl.")
    # the pools are the executor's own placement (its resource_pool option), not the adapter's
    assert executors_ray.RayResourcePool.__module__ == "executors_ray._pool"


@pytest.mark.parametrize("module", ["executors_ray", "executors_ray.verl", "executors_ray.testing"])
def test_importing_does_not_import_ray(module: str) -> None:
    code = f"import sys, {module}; print('ray' in sys.modules)"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120, check=True
    )
    assert done.stdout.strip() == "False"


def test_the_testing_module_exports_fixtures_not_workers() -> None:
    assert executors_ray.testing.__all__ == ["TEST_NUM_CPUS", "ray_session"]
