"""pytest plugin (auto-loaded through the ``pytest11`` entry point).

Gives tests a ``make_group`` fixture that builds WorkerGroups and always
shuts them down, and a ``--dispatchcore-backend`` option to pick the
default backend for a test run.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("dispatchcore")
    group.addoption(
        "--dispatchcore-backend",
        default=None,
        help="backend make_group uses when a test does not name one (default: local)",
    )


@pytest.fixture
def make_group(request: pytest.FixtureRequest) -> Iterator[Any]:
    """``make_group(worker_cls, world_size, **kw)``: a WorkerGroup shut down after the test."""
    from dispatchcore import WorkerGroup

    groups: list[Any] = []
    default_backend = request.config.getoption("--dispatchcore-backend")

    def make(worker_cls: type, world_size: int | None = None, **kwargs: Any) -> Any:
        if default_backend and "backend" not in kwargs:
            kwargs["backend"] = default_backend
        group: Any = WorkerGroup(worker_cls, world_size, **kwargs)
        groups.append(group)
        return group

    yield make
    for group in groups:
        group.shutdown()
