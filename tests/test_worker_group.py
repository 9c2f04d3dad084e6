"""WorkerGroup binding, backend choice and misuse errors (on the local executor)."""

from __future__ import annotations

import re
import traceback
from collections.abc import Callable

import pytest

from dispatchcore import (
    BackendNotFoundError,
    DispatchError,
    RegistrationError,
    Worker,
    WorkerError,
    WorkerGroup,
    create_colocated_worker_cls,
    register,
)
from dispatchcore.testing.workers import ActorRole, EchoWorker


def chosen_backend(make: Callable[[], WorkerGroup[EchoWorker]]) -> str:
    """The backend a group built by ``make`` chose: its name, or the name no installed backend has."""
    try:
        with make() as wg:
            return wg.backend
    except BackendNotFoundError as err:
        found = re.match(r"no backend named '(\w+)'", str(err))
        assert found, str(err)
        return found.group(1)


def test_backend_choice_order(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DISPATCHCORE_BACKEND", raising=False)
    assert chosen_backend(lambda: WorkerGroup(EchoWorker, 1)) == "local"
    monkeypatch.setenv("DISPATCHCORE_BACKEND", "from_env")
    assert chosen_backend(lambda: WorkerGroup(EchoWorker, 1)) == "from_env"
    config = {"backend": "from_config", "world_size": 1}
    assert chosen_backend(lambda: WorkerGroup.from_config(config, EchoWorker)) == "from_config"
    assert chosen_backend(lambda: WorkerGroup.from_config(config, EchoWorker, backend="from_arg")) == "from_arg"


def test_environment_backend_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DISPATCHCORE_BACKEND", "no_such_backend")
    with pytest.raises(BackendNotFoundError, match="no_such_backend"):
        WorkerGroup(EchoWorker, 2)


def test_from_config_takes_any_mapping() -> None:
    config = {"backend": "local", "world_size": 3, "call_timeout": 30, "local": {"start_timeout": 10}}
    with WorkerGroup.from_config(config, EchoWorker) as wg:
        assert wg.backend == "local" and wg.world_size == 3
    with pytest.raises(TypeError, match="unknown option"):
        WorkerGroup.from_config({"world_size": 1, "local": {"bogus": 1}}, EchoWorker)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"world_size": 0}, ValueError, "world_size"),
        ({"world_size": None}, ValueError, "world_size is required"),
        ({"world_size": 2, "call_timeout": -1}, ValueError, "call_timeout"),
        ({"world_size": 2, "death_timeout": None}, ValueError, "death_timeout"),
        ({"world_size": 2, "isolate": "no"}, TypeError, "isolate"),
    ],
)
def test_bad_arguments_are_named(kwargs: dict, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        WorkerGroup(EchoWorker, **kwargs)


def test_name_collision_with_group_attributes_refused() -> None:
    class Clashing(Worker):
        @register
        def shutdown(self) -> None: ...

    with pytest.raises(RegistrationError, match="shutdown"):
        WorkerGroup(Clashing, 1)


def test_proxy_named_after_method_shows_in_tracebacks() -> None:
    class Failing(Worker):
        @register
        def update_actor(self) -> None:
            raise RuntimeError("boom")

    with WorkerGroup(Failing, 1) as wg:
        assert type(wg.update_actor).__name__ == "update_actor"
        with pytest.raises(WorkerError) as info:
            wg.update_actor()
        frames = [f.name for f in traceback.extract_tb(info.value.__traceback__)]
        assert "update_actor" in frames
        with pytest.raises(ValueError, match="timeout"):
            wg.update_actor.options(timeout=0)


def test_spawn_needs_a_colocated_class() -> None:
    with WorkerGroup(EchoWorker, 1) as wg, pytest.raises(DispatchError, match="create_colocated_worker_cls"):
        wg.spawn({"actor"})
    cls = create_colocated_worker_cls({"actor": ActorRole})
    with WorkerGroup(cls, 1) as wg:
        with pytest.raises(KeyError, match="unknown role"):
            wg.spawn({"critic"})
        actor = wg.spawn({"actor"})["actor"]
        actor.shutdown()  # a view leaves the shared ranks alone
        assert wg.spawn({"actor"})["actor"].whoami()[0][0] == "actor"
    with pytest.raises(WorkerError, match="unknown role"):
        WorkerGroup(cls, 1, init_kwargs={"critic": {}})
    with pytest.raises(ValueError, match="non-empty"):
        create_colocated_worker_cls({})


def test_repr_and_worker_cls() -> None:
    with WorkerGroup(EchoWorker, 2) as wg:
        assert "EchoWorker x2 on 'local'" in repr(wg)
        assert wg.worker_cls is EchoWorker
    assert "closed" in repr(wg)


def test_pytest_plugin_make_group_fixture(make_group) -> None:  # type: ignore[no-untyped-def]
    wg = make_group(EchoWorker, 2)
    assert [i["rank"] for i in wg.info()] == [0, 1]
