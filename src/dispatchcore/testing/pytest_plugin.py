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

Hypothesis runs a ``@given`` test's body many times per fixture set-up, so it
refuses function-scoped fixtures (the ``function_scoped_fixture`` health
check).  ``make_module_group`` is the module-scoped twin of ``make_group``: a
call with arguments it has seen returns the group it made then (still usable:
a group shut down or broken is made anew), and every group it made is shut
down when the module's tests end.  Start the group in a module fixture, so no
example pays for start-up (Hypothesis's 200 ms deadline)::

    @pytest.fixture(scope="module")
    def actors(make_module_group):
        return make_module_group(Actor, 4)

    @given(batch=dataprotos(min_len=1, auto_padding=True))
    def test_update_keeps_every_row(actors, batch):
        assert len(actors.update_actor(batch)) == len(batch)

Calling ``make_module_group(Actor, 4)`` inside the test works too (every
example gets the same group), with ``@settings(deadline=None)`` for the first
example's start-up.  Worker state carries over from example to example (and
test to test in the module); groups with ``faults=`` are never reused (a
fault counts a group's calls).  ``dispatchcore_backend`` is session-scoped
(it was function-scoped) so that both fixtures can use it; a conftest that
overrides it needs module or session scope for ``make_module_group``.
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


@pytest.fixture(scope="session")
def dispatchcore_backend(request: pytest.FixtureRequest) -> str:
    """The backend this test run uses: ``--dispatchcore-backend``, else ``$DISPATCHCORE_BACKEND``, else ``local``."""
    chosen = request.config.getoption("--dispatchcore-backend")
    return str(chosen or os.environ.get(BACKEND_ENV) or "local")


class GroupMaker:
    """``maker(worker_cls, world_size, **kw)``: WorkerGroups on the run's backend, shut down by :meth:`close`.

    With ``reuse=True`` a call repeating an earlier call's arguments returns
    the group that call made, while it is usable (what ``make_module_group``
    does, so Hypothesis examples share a group).
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

    The backend is ``kw["backend"]`` if given, else the run's
    (``--dispatchcore-backend``).  With ``faults=[...]`` the group runs on
    ``backend="faulty"`` wrapping that backend.
    """
    maker = GroupMaker(dispatchcore_backend)
    yield maker
    maker.close()


@pytest.fixture(scope="module")
def make_module_group(dispatchcore_backend: str) -> Iterator[GroupMaker]:
    """``make_group`` for the whole module, for ``@given`` tests: the same arguments give the same group.

    Module-scoped, so Hypothesis's ``function_scoped_fixture`` health check
    does not fire; groups are shut down when the module's tests end.
    """
    maker = GroupMaker(dispatchcore_backend, reuse=True)
    yield maker
    maker.close()
