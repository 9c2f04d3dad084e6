"""Fault-suite fixtures: figures for RELIABILITY.md and leak checks.

Set ``DISPATCHCORE_RELIABILITY_OUT=path.jsonl`` and every ``record(...)``
appends one JSON line there (``scripts/reliability_report.py`` turns the
lines into RELIABILITY.md); unset, ``record`` only checks its input.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from typing import Any

import pytest

_LOCK = threading.Lock()


def _write(table: str, **row: Any) -> None:
    path = os.environ.get("DISPATCHCORE_RELIABILITY_OUT")
    line = json.dumps({"table": table, **row}, default=str)  # key order = column order
    if path:
        with _LOCK, open(path, "a") as f:
            f.write(line + "\n")


@pytest.fixture
def record() -> Callable[..., None]:
    """``record(table, **row)``: one row of RELIABILITY.md (``table`` is e.g. ``"faults/ray"``)."""
    return _write


# -- backends ------------------------------------------------------------------
#: One FaultWorker group per backend for the whole run (see ``shared_group``).
_shared: dict[str, Any] = {}


def _shared_group(name: str) -> Any:
    from dispatchcore import WorkerGroup

    from ._harness import DEATH_TIMEOUT
    from ._workers import FaultWorker

    wg = _shared.get(name)
    if wg is not None and wg.executor.broken is not None:
        wg.shutdown()
        wg = None
    if wg is None:
        wg = _shared[name] = WorkerGroup(FaultWorker, 2, backend=name, death_timeout=DEATH_TIMEOUT)
        wg.ping()
    return wg


@pytest.fixture
def backend(request: pytest.FixtureRequest) -> str:
    """The backend of a test parametrized with ``indirect=["backend"]`` (see ``_harness.backend_params``).

    Ray tests get the session's Ray.  The backend's shared group is up
    before the test starts, so what a backend sets up once per process
    (Ray's driver threads, multiprocessing's resource tracker, gloo) is
    never counted as a leak of the test's own group.
    """
    name: str = request.param
    if name == "ray":
        request.getfixturevalue("ray_session")
    _shared_group(name)
    return name


@pytest.fixture
def shared_group(backend: str) -> Any:
    """The backend's ``FaultWorker`` group (world size 2) shared by every test that leaves it usable.

    A test that broke it (a failure of that test) gets it replaced for the next one.
    """
    return _shared_group(backend)


@pytest.fixture(scope="package", autouse=True)
def _shut_shared_groups() -> Any:
    yield
    for wg in _shared.values():
        wg.shutdown()
    _shared.clear()
