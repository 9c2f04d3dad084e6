"""A newcomer's first hour (issue 25): one install for every backend but Ray, and one "cannot be pickled" error.

What the ranks need (the worker class, init arguments, call arguments) and
cannot be pickled is refused before anything is sent, with one
:class:`~dispatchcore.UnpicklableError` wording on every backend that names
the path to the object at fault; ``local`` with ``isolate=False`` pickles
nothing and refuses nothing.  A worker's ``sys.exit`` is a ``WorkerError``
everywhere; deaths on threads are tested with the ``faulty`` backend.

This module travels by value (as a driver script does), so its classes
carry their class attributes and the globals their methods use.
"""

from __future__ import annotations

import inspect
import os
import pickle
import re
import subprocess
import sys
import threading
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import dispatchcore
from dispatchcore import (
    BackendNotFoundError,
    DataProto,
    Dispatch,
    DispatchAttributeError,
    DispatchError,
    DispatchTypeError,
    DispatchValueError,
    UnpicklableError,
    Worker,
    WorkerDiedError,
    WorkerError,
    WorkerGroup,
    available_backends,
    create_colocated_worker_cls,
    register,
)
from dispatchcore.testing import Fault
from dispatchcore.wire import find_unpicklable

ROOT = Path(__file__).resolve().parents[1]
cloudpickle = pytest.importorskip("cloudpickle")
cloudpickle.register_pickle_by_value(sys.modules[__name__])
try:
    from ray import cloudpickle as _ray_cloudpickle

    _ray_cloudpickle.register_pickle_by_value(sys.modules[__name__])
except ImportError:  # no ray: its cases skip
    pass

#: Every backend whose pickling this issue made one; those not installed skip.
BACKENDS = ["local", "torchrun", "multiprocess", "ray"]
pytestmark = pytest.mark.timeout(120)


class Registry:
    """A helper defined in the driver with a class-level lock: it travels by value, lock included."""

    lock = threading.Lock()


class UsesRegistry(Worker):
    @register(Dispatch.ONE_TO_ALL)
    def step(self) -> str:
        return Registry.__name__


class LockedClass(Worker):
    lock = threading.Lock()


class Echo(Worker):
    """Records every call it runs, so a test can see that a refused call ran nowhere."""

    def __init__(self, cfg: Any = None) -> None:
        self.cfg = cfg
        self.ran: list[str] = []

    @register(Dispatch.ONE_TO_ALL)
    def score(self, cfg: Any, extra: Any = None) -> int:
        self.ran.append("score")
        return 1

    @register(Dispatch.ONE_TO_ALL, blocking=False)
    def score_later(self, cfg: Any) -> int:
        self.ran.append("score_later")
        return 1

    @register(Dispatch.DP_COMPUTE_PROTO)
    def rows(self, data: DataProto) -> DataProto:
        self.ran.append("rows")
        return data

    @register(Dispatch.ONE_TO_ALL)
    def history(self) -> list[str]:
        return list(self.ran)

    @register(Dispatch.ONE_TO_ALL)
    def give_lock(self) -> dict[str, Any]:
        return {"ok": 1, "lock": threading.Lock()}

    @register(Dispatch.RANK_ZERO)
    def leave(self, code: int) -> None:
        sys.exit(code)


def _need(backend: str, request: pytest.FixtureRequest) -> None:
    if backend not in available_backends():
        pytest.skip(f"backend {backend!r} is not installed here")
    if backend == "ray":
        request.getfixturevalue("ray_session")


def _children() -> set[int]:
    """Processes whose parent is this one (Linux ``/proc``)."""
    me, found = str(os.getpid()), set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if stat.rpartition(")")[2].split()[1] == me:
                found.add(int(entry.name))
    return found


@pytest.fixture(scope="module")
def groups() -> Iterator[dict[str, WorkerGroup[Echo]]]:
    """One started group per backend, made on first use and shared by the module's tests."""
    made: dict[str, WorkerGroup[Echo]] = {}
    yield made
    for wg in made.values():
        wg.shutdown()


def _group_for(backend: str, request: pytest.FixtureRequest, groups: dict[str, WorkerGroup[Echo]]) -> WorkerGroup[Echo]:
    _need(backend, request)
    if backend not in groups:  # one rank per process backend: starting processes is the file's cost
        groups[backend] = WorkerGroup(Echo, 2 if backend == "local" else 1, backend=backend)
    return groups[backend]


@pytest.fixture(params=BACKENDS)
def group(request: pytest.FixtureRequest, groups: dict[str, WorkerGroup[Echo]]) -> WorkerGroup[Echo]:
    return _group_for(request.param, request, groups)


# -- 1. one install: cloudpickle is the core's ------------------------------------------------------


def test_cloudpickle_is_a_core_dependency_and_ray_stays_an_extra() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = [re.split(r"[<>=!~\[ ;]", req, maxsplit=1)[0] for req in project["dependencies"]]
    assert "cloudpickle" in names
    extras = project["optional-dependencies"]
    assert extras["torchrun"] == []  # kept as an alias: the plain install has everything
    assert any(req.startswith("ray") for req in extras["ray"])
    assert not any("cloudpickle" in req for req in extras["ray"] + extras["test"])


def test_backends_command_shows_torchrun_available() -> None:
    from executors_torchrun import TorchrunExecutor

    assert TorchrunExecutor.extra is None and TorchrunExecutor.missing_requirements() == []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    listing = subprocess.run(
        [sys.executable, "-m", "dispatchcore._cli", "backends"], capture_output=True, text=True, env=env, check=True
    ).stdout
    (line,) = [row for row in listing.splitlines() if row.startswith("torchrun ")]
    assert line.rstrip().endswith("available"), listing


def test_readme_install_lines() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "pip install torch==2.13.0 && pip install -e . && dispatchcore demo" in readme
    assert "cloudpickle" in readme and 'pip install "dispatchcore[ray]"' in readme
    assert "--backend torchrun" in readme  # the try-line that a plain install now runs


# -- 2. the path to the culprit ----------------------------------------------------------------------


def test_find_unpicklable_names_the_path() -> None:
    lock = threading.Lock()
    assert find_unpicklable({"a": [1, torch.ones(2)]}, "cfg") is None
    found = find_unpicklable({"a": 1, "deep": [0, {"x": threading.Event()}]}, "cfg")
    assert found is not None and found.where("argument 'cfg'") == "argument 'cfg' → cfg['deep'][1]['x']"
    assert isinstance(found.value, threading.Event) and not found.by_value
    closure = find_unpicklable({"callback": lambda: lock}, "cfg")
    assert closure is not None and closure.path == ("cfg['callback']", "lock") and closure.by_value
    # In one process callables are shared, not pickled (share_callables=True, as local's isolation copy).
    assert find_unpicklable({"callback": lambda: lock}, "cfg", share_callables=True) is None
    assert find_unpicklable(lock, "cfg").path == ()  # type: ignore[union-attr]
    data = DataProto.from_dict({"x": torch.arange(2)}, meta_info={"lock": lock})
    assert find_unpicklable(data, "data").path == ("data.meta_info['lock']",)  # type: ignore[union-attr]


def test_find_unpicklable_follows_classes_that_travel_by_value() -> None:
    uses = find_unpicklable(UsesRegistry, "UsesRegistry")
    assert uses is not None and uses.path == ("UsesRegistry.step", "Registry.lock") and uses.by_value

    class Sub(Registry):
        pass

    assert find_unpicklable(Sub, "Sub").path == ("Registry.lock",)  # type: ignore[union-attr]
    assert find_unpicklable(LockedClass, "LockedClass").path == ("LockedClass.lock",)  # type: ignore[union-attr]


def test_unpicklable_error_is_a_dispatch_error_and_a_type_error() -> None:
    error = UnpicklableError("m", where="argument 'cfg'", method="score", in_process=True)
    assert isinstance(error, DispatchError) and isinstance(error, TypeError)
    again = pickle.loads(pickle.dumps(error))
    assert (str(again), again.where, again.method, again.in_process) == ("m", "argument 'cfg'", "score", True)


CREATION_CASES = {
    "class attribute of a global the methods use": (
        lambda backend: WorkerGroup(UsesRegistry, 2, backend=backend),
        "the group of UsesRegistry was not started: worker class UsesRegistry → UsesRegistry.step → Registry.lock "
        "cannot be pickled (cannot pickle '_thread.lock' object); classes and functions defined in the driver",
    ),
    "class attribute": (
        lambda backend: WorkerGroup(LockedClass, 2, backend=backend),
        "worker class LockedClass → LockedClass.lock cannot be pickled",
    ),
    "init keyword argument": (
        lambda backend: WorkerGroup(Echo, 2, backend=backend, init_kwargs={"cfg": {"callback": threading.Event()}}),
        "init argument 'cfg' → cfg['callback'] cannot be pickled (a threading.Event: cannot pickle '_thread.lock'",
    ),
    "init positional argument": (
        lambda backend: WorkerGroup(Echo, 2, backend=backend, init_args=(threading.Lock(),)),
        "init argument 'cfg' cannot be pickled (cannot pickle '_thread.lock' object); each rank gets a pickled copy",
    ),
}


@pytest.mark.parametrize("case", sorted(CREATION_CASES))
def test_group_creation_refuses_the_same_way_on_every_backend(case: str, request: pytest.FixtureRequest) -> None:
    """Refused before any process, actor or thread starts: the message is the same string everywhere."""
    make, expected = CREATION_CASES[case]
    messages = {}
    for backend in [b for b in BACKENDS if b in available_backends()]:
        _need(backend, request)  # Ray: the session's, started before counting processes
        before, threads = _children(), set(threading.enumerate())
        with pytest.raises(UnpicklableError) as info:
            make(backend)
        assert _children() <= before, f"{backend} started processes for a group it refused"
        assert not [t.name for t in set(threading.enumerate()) - threads if t.name.startswith("dispatchcore-")]
        assert info.value.method == "__init__"
        messages[backend] = str(info.value)
    assert len(set(messages.values())) == 1, messages
    assert expected in messages["local"]


def test_local_without_isolation_pickles_nothing_and_refuses_nothing() -> None:
    lock = threading.Lock()
    with WorkerGroup(UsesRegistry, 2, isolate=False) as wg:
        assert wg.step() == ["Registry", "Registry"]
    with WorkerGroup(LockedClass, 1, isolate=False):
        pass
    with WorkerGroup(Echo, 2, isolate=False, init_kwargs={"cfg": {"callback": threading.Event()}}) as wg:
        assert wg.score({"x": [1, lock]}, extra=threading.Event()) == [1, 1]
        data = DataProto.from_dict({"x": torch.arange(4)}, meta_info={"lock": lock})
        assert wg.rows(data).batch["x"].tolist() == [0, 1, 2, 3]
        assert wg.history() == [["score", "rows"]] * 2


def _refused(wg: WorkerGroup[Echo], call: Any) -> str:
    before = wg.history()
    with pytest.raises(UnpicklableError) as info:
        call()
    assert wg.history() == before, "a refused call ran on some rank"
    return str(info.value)


def test_call_arguments_are_refused_before_anything_is_sent(group: WorkerGroup[Echo]) -> None:
    lock = threading.Lock()
    message = _refused(group, lambda: group.score({"x": [1, lock]}))
    assert message.startswith("call 'score' was not sent: argument 'cfg' → cfg['x'][1] cannot be pickled")
    assert "(cannot pickle '_thread.lock' object); each rank gets a pickled copy" in message
    keyword = _refused(group, lambda: group.score(1, extra=threading.Event()))
    assert keyword.startswith("call 'score' was not sent: argument 'extra' cannot be pickled (a threading.Event")
    # blocking=False: refused by the call itself, before any future exists
    assert _refused(group, lambda: group.score_later(lock)).startswith("call 'score_later' was not sent: argument")
    data = DataProto.from_dict({"x": torch.arange(4)}, meta_info={"lock": lock})
    rows = _refused(group, lambda: group.rows(data))
    of_rank = " of rank 0" if group.world_size > 1 else ""  # each rank's chunk is its own object
    assert f"argument 'data'{of_rank} → data.meta_info['lock'] cannot be pickled" in rows
    assert group.score(1) == [1] * group.world_size  # the group stays usable


def test_call_argument_wording_is_the_same_on_every_backend(
    request: pytest.FixtureRequest, groups: dict[str, WorkerGroup[Echo]]
) -> None:
    messages = {}
    for backend in [b for b in BACKENDS if b in available_backends()]:
        wg = _group_for(backend, request, groups)
        with pytest.raises(UnpicklableError) as info:
            wg.score({"cb": threading.Event()})
        messages[backend] = str(info.value)
    assert len(set(messages.values())) == 1, messages


def test_unpicklable_result_names_its_path(group: WorkerGroup[Echo]) -> None:
    with pytest.raises(WorkerError) as info:
        group.give_lock()
    assert info.value.exc_message.startswith("its result → result['lock'] cannot be pickled"), info.value.exc_message


def test_callables_are_shared_on_local_not_pickled() -> None:
    """In one process a function passes by reference (as pickle passes importable ones): a lambda over a lock works."""
    lock = threading.Lock()
    with WorkerGroup(Echo, 2) as wg:
        assert wg.score(lambda: lock) == [1, 1]


# -- 4. did-you-mean, and every deliberate error a DispatchError ---------------------------------------


def test_a_misspelled_method_suggests_the_registered_one() -> None:
    with WorkerGroup(Echo, 1) as wg:
        for spelled in (lambda: wg.scroe, lambda: wg.call.scroe):
            with pytest.raises(DispatchAttributeError, match=r"no @register method 'scroe'.*did you mean 'score'\?"):
                spelled()
        with pytest.raises(AttributeError, match=r"did you mean 'shutdown'\?"):
            wg.shutdwon  # noqa: B018 - the lookup is the test
        assert not hasattr(wg, "scroe") and getattr(wg.call, "scroe", None) is None  # still AttributeErrors
        with pytest.raises(AttributeError) as private:
            wg._no_such_thing  # noqa: B018 - protocol and private lookups get the plain error
        assert type(private.value) is AttributeError


def test_a_misspelled_backend_or_option_suggests_the_known_one() -> None:
    with pytest.raises(BackendNotFoundError, match=r"no backend named 'lcoal' \(did you mean 'local'\?\)"):
        WorkerGroup(Echo, 1, backend="lcoal")
    with pytest.raises(BackendNotFoundError, match=r"'Ray' \(did you mean 'ray'\? names are case-sensitive\)"):
        WorkerGroup(Echo, 1, backend="Ray")
    with pytest.raises(DispatchTypeError, match=r"\['start_timout'\].*did you mean 'start_timeout'\?"):
        WorkerGroup(Echo, 1, start_timout=5)


def _view_mistakes(wg: WorkerGroup[Echo]) -> dict[str, tuple[type[Exception], Any]]:
    return {
        "wg[9]": (IndexError, lambda: wg[9]),
        "wg[0:0]": (ValueError, lambda: wg[0:0]),
        "wg['a']": (TypeError, lambda: wg["a"]),
        "wg.ranks([])": (ValueError, lambda: wg.ranks([])),
        "wg.ranks('0')": (TypeError, lambda: wg.ranks("0")),
        "wg.ranks([0, 0])": (ValueError, lambda: wg.ranks([0, 0])),
        "wg.replace_rank(9)": (ValueError, lambda: wg.replace_rank(9)),
        "wg.rank_stacks(timeout=0)": (ValueError, lambda: wg.rank_stacks(timeout=0)),
        "wg.spawn(['actor'])": (DispatchError, lambda: wg.spawn(["actor"])),
    }


GROUP_MISTAKES: dict[str, tuple[type[Exception], dict[str, Any]]] = {
    "world_size=0": (ValueError, {"world_size": 0}),
    "world_size='2'": (ValueError, {"world_size": "2"}),
    "world_size=None off torchrun": (ValueError, {"world_size": None}),
    "isolate='yes'": (TypeError, {"isolate": "yes"}),
    "init_args=3": (TypeError, {"init_args": 3}),
    "on_rank_death='retry'": (ValueError, {"on_rank_death": "retry"}),
    "lazy='yes'": (TypeError, {"lazy": "yes"}),
    "lazy_budget_bytes=-1": (ValueError, {"lazy_budget_bytes": -1}),
    "call_timeout=0": (ValueError, {"call_timeout": 0}),
    "death_timeout=-1": (ValueError, {"death_timeout": -1}),
    "cancel_grace=0": (ValueError, {"cancel_grace": 0}),
    "an unknown option": (TypeError, {"no_such_option": 1}),
}


@pytest.mark.parametrize("mistake", sorted(GROUP_MISTAKES))
def test_every_group_argument_mistake_is_a_dispatch_error_and_its_builtin(mistake: str) -> None:
    builtin, kwargs = GROUP_MISTAKES[mistake]
    kwargs = {"world_size": 1, **kwargs}
    with pytest.raises(builtin) as info:
        WorkerGroup(Echo, kwargs.pop("world_size"), backend="local", **kwargs)
    assert isinstance(info.value, DispatchError), type(info.value).__mro__


def test_every_view_and_config_mistake_is_a_dispatch_error_and_its_builtin() -> None:
    with pytest.raises(TypeError) as info:
        WorkerGroup(Echo.score, 1)  # type: ignore[arg-type]  # a method, not a class
    assert isinstance(info.value, DispatchError)
    for config in (3, {"backend": "local", "world_size": 1, "local": 5}):
        with pytest.raises(TypeError) as info:
            WorkerGroup.from_config(config, Echo)  # type: ignore[arg-type]
        assert isinstance(info.value, DispatchError)
    with WorkerGroup(Echo, 2) as wg:
        for name, (builtin, mistake) in _view_mistakes(wg).items():
            with pytest.raises(builtin) as info:
                mistake()
            assert isinstance(info.value, DispatchError), (name, type(info.value).__mro__)
    with WorkerGroup(create_colocated_worker_cls({"actor": Echo}), 1) as roles:
        with pytest.raises(KeyError, match=r"^unknown role\(s\) \['critic'\]") as missing:
            roles.spawn(["critic"])
        assert isinstance(missing.value, DispatchError)


@pytest.mark.parametrize(
    ("options", "builtin"),
    [({"world_size": 0}, DispatchValueError), ({"no_such_option": 1}, DispatchTypeError)],
    ids=["world_size=0", "an unknown option"],
)
def test_the_same_mistake_is_the_same_type_on_every_backend(options: dict[str, Any], builtin: type) -> None:
    """Refused before any rank starts, so no backend needs to run (Ray is not even started)."""
    options = {"world_size": 2, **options}
    for backend in [b for b in BACKENDS if b in available_backends()]:
        with pytest.raises(builtin):
            WorkerGroup(
                Echo, options["world_size"], backend=backend, **{k: v for k, v in options.items() if k != "world_size"}
            )


def test_spare_ranks_of_the_wrong_kind_is_the_same_type_where_it_exists() -> None:
    for backend in [b for b in ("torchrun", "ray") if b in available_backends()]:
        with pytest.raises(DispatchValueError, match="spare_ranks must be an int >= 0"):
            WorkerGroup(Echo, 1, backend=backend, spare_ranks=-1)


def test_the_error_tree_names_every_error_class() -> None:
    tree = inspect.getmodule(DispatchError).__doc__ or ""  # type: ignore[union-attr]
    errors = [n for n in dispatchcore.__all__ if isinstance(getattr(dispatchcore, n), type)]
    for name in errors:
        cls = getattr(dispatchcore, name)
        if issubclass(cls, DispatchError) and cls.__module__ == DispatchError.__module__:
            assert name in tree, name
            builtins = [b for b in cls.__mro__ if issubclass(b, BaseException) and not issubclass(b, DispatchError)]
            assert cls is DispatchError or builtins[0] not in (Exception, BaseException), f"{name}: no builtin"


# -- 5. exits and deaths ---------------------------------------------------------------------------


def test_sys_exit_in_a_worker_is_a_worker_error(group: WorkerGroup[Echo]) -> None:
    with pytest.raises(WorkerError) as info:
        group.leave(3)
    assert info.value.exc_type == "SystemExit" and info.value.rank == 0 and info.value.method == "leave"
    assert group.score(1) == [1] * group.world_size  # the rank is alive and the group usable


def test_faulty_backend_plays_a_death_on_threads() -> None:
    """What docs/errors.md offers instead of ``os._exit`` on ``local``: a planted death."""
    with WorkerGroup(Echo, 2, backend="faulty", inner="local", faults=[Fault.die(rank=1, method="score")]) as wg:
        with pytest.raises(WorkerDiedError) as info:
            wg.score(1)
        assert info.value.rank == 1


def test_readme_says_what_travels_by_value_and_that_os_exit_ends_a_local_driver() -> None:
    errors = (ROOT / "docs" / "errors.md").read_text()
    for promise in ("UnpicklableError", "by value", "__init__", "isolate=False", "os._exit", "faulty", "sys.exit"):
        assert promise in errors, promise
