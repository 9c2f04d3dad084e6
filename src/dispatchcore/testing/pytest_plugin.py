"""pytest plugin (auto-loaded through the ``pytest11`` entry point).

Gives tests a ``make_group`` fixture that builds WorkerGroups and always
shuts them down, a ``--dispatchcore-backend`` option to pick the backend a
test run uses, and a ``dispatchcore_backend`` fixture holding that choice::

    def test_update(make_group):
        wg = make_group(Actor, 4)                     # on the backend chosen for the run
        ...

    def test_driver_survives_a_crash(make_group):
        wg = make_group(Actor, 4, faults=[Fault.die(rank=1, method="update", call=2)])
        ...                                           # the same backend, wrapped by "faulty"

``python -m pytest --dispatchcore-backend=ray`` reruns the same tests on Ray.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

BACKEND_ENV = "DISPATCHCORE_BACKEND"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("dispatchcore")
    group.addoption(
        "--dispatchcore-backend",
        default=None,
        help="backend make_group uses when a test does not name one (default: $DISPATCHCORE_BACKEND, else local)",
    )


@pytest.fixture
def dispatchcore_backend(request: pytest.FixtureRequest) -> str:
    """The backend this test run uses: ``--dispatchcore-backend``, else ``$DISPATCHCORE_BACKEND``, else ``local``."""
    chosen = request.config.getoption("--dispatchcore-backend")
    return str(chosen or os.environ.get(BACKEND_ENV) or "local")


@pytest.fixture
def make_group(request: pytest.FixtureRequest, dispatchcore_backend: str) -> Iterator[Any]:
    """``make_group(worker_cls, world_size, **kw)``: a WorkerGroup shut down after the test.

    The backend is ``kw["backend"]`` if given, else the run's
    (``--dispatchcore-backend``).  With ``faults=[...]`` the group runs on
    ``backend="faulty"`` wrapping that backend.
    """
    from dispatchcore import WorkerGroup

    groups: list[Any] = []

    def make(worker_cls: type, world_size: int | None = None, **kwargs: Any) -> Any:
        backend = kwargs.pop("backend", None) or dispatchcore_backend
        if "faults" in kwargs and backend != "faulty":
            kwargs.setdefault("inner", backend)
            backend = "faulty"
        group: Any = WorkerGroup(worker_cls, world_size, backend=backend, **kwargs)
        groups.append(group)
        return group

    yield make
    for group in groups:
        group.shutdown()
