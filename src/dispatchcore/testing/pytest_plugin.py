"""pytest plugin (auto-loaded through the ``pytest11`` entry point): ``make_group`` and its backend.

Usage: docs/testing.md.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

BACKEND_ENV = "DISPATCHCORE_BACKEND"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup("dispatchcore").addoption(
        "--dispatchcore-backend",
        default=None,
        help="backend make_group uses when a test does not name one (default: $DISPATCHCORE_BACKEND, else local)",
    )


@pytest.fixture(scope="session")
def dispatchcore_backend(request: pytest.FixtureRequest) -> str:
    """The backend this test run uses: ``--dispatchcore-backend``, else ``$DISPATCHCORE_BACKEND``, else ``local``."""
    chosen = request.config.getoption("--dispatchcore-backend")
    return str(chosen or os.environ.get(BACKEND_ENV) or "local")


class GroupMaker:
    """``maker(worker_cls, world_size, **kw)``: WorkerGroups on the run's backend, shut down by :meth:`close`.

    ``reuse=True``: the same arguments give the group made then, while it is
    usable (groups with ``faults=`` excepted: a fault counts a group's calls).
    """

    def __init__(self, backend: str, *, reuse: bool = False) -> None:
        self._backend = backend
        self._reuse = reuse
        self._groups: list[Any] = []
        self._made: dict[Any, Any] = {}

    def __call__(self, worker_cls: type, world_size: int | None = None, **kwargs: Any) -> Any:
        from dispatchcore import DispatchError, WorkerGroup

        backend = kwargs.pop("backend", None) or self._backend
        if "faults" in kwargs and backend != "faulty":
            kwargs.setdefault("inner", backend)
            backend = "faulty"
        key = _reuse_key(worker_cls, world_size, backend, kwargs) if self._reuse else None
        group = self._made.get(key) if key is not None else None
        if group is not None:
            try:
                group.ensure_usable()
                return group
            except DispatchError:
                pass  # shut down or broken by an earlier example: make a new one
        group = WorkerGroup(worker_cls, world_size, backend=backend, **kwargs)
        self._groups.append(group)
        if key is not None:
            self._made[key] = group
        return group

    def close(self) -> None:
        """Shut down every group made (idempotent)."""
        groups, self._groups = self._groups, []
        self._made.clear()
        for group in groups:
            group.shutdown()


def _reuse_key(worker_cls: type, world_size: int | None, backend: str, kwargs: dict[str, Any]) -> Any:
    """What identifies a group to reuse, or ``None`` (faults planted, or arguments that cannot be compared)."""
    if backend == "faulty":
        return None
    key = (worker_cls, world_size, backend, _frozen(kwargs))
    try:
        hash(key)
    except TypeError:
        return None
    return key


def _frozen(value: Any) -> Any:
    if isinstance(value, dict):
        return tuple(sorted(((k, _frozen(v)) for k, v in value.items()), key=lambda kv: repr(kv[0])))
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, *(_frozen(v) for v in value))
    return value


@pytest.fixture
def make_group(dispatchcore_backend: str) -> Iterator[GroupMaker]:
    """``make_group(worker_cls, world_size, **kw)``: a WorkerGroup shut down after the test.

    The backend is ``kw["backend"]`` if given, else the run's (``--dispatchcore-backend``); with
    ``faults=[...]`` the group runs on ``backend="faulty"`` wrapping that backend.
    """
    maker = GroupMaker(dispatchcore_backend)
    yield maker
    maker.close()


@pytest.fixture(scope="module")
def make_module_group(dispatchcore_backend: str) -> Iterator[GroupMaker]:
    """``make_group`` for the whole module, for ``@given`` tests: the same arguments give the same group."""
    maker = GroupMaker(dispatchcore_backend, reuse=True)
    yield maker
    maker.close()
