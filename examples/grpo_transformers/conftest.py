"""Test-run setup: the ranks (self-started torchrun processes, Ray actors) cannot import ``train`` by name.

pytest puts this folder on ``sys.path``, so the tests import ``train`` as a
project's tests would; its classes and functions travel to the ranks by value.
"""

from __future__ import annotations

import cloudpickle
import pytest

pytest.importorskip("transformers", reason="the example needs transformers (the `test` extra installs it)")

import train  # noqa: E402

cloudpickle.register_pickle_by_value(train)

try:  # ``ray_session`` (session scope) starts one local Ray for the Ray variant
    from executors_ray.testing import ray_session  # noqa: F401
except ImportError:  # the ray executor package is absent: that test skips
    pass
