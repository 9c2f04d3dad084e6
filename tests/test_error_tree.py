"""One error tree, enforced (issue 35): every raise on purpose is a DispatchError and its builtin, and the errors
that misled a newcomer give the right hint.

The scan reads ``src`` with ``ast`` for ``raise <builtin>(...)`` and compares
what it finds with :data:`ALLOWED`, where each bare raise that stays says why.
A new bare raise fails here until it is converted (``DispatchValueError``,
``DispatchTypeError``, ...) or allowed with its reason; an allowed one that is
gone fails too, so the list stays true.
"""

from __future__ import annotations

import ast
import builtins
import inspect
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch

import dispatchcore
from dispatchcore import (
    BatchSizeError,
    DataProto,
    DataProtoFuture,
    Dispatch,
    DispatchError,
    DispatchImportError,
    DispatchIndexError,
    DispatchKeyError,
    DispatchRuntimeError,
    DispatchTimeoutError,
    DispatchTypeError,
    DispatchValueError,
    Worker,
    WorkerGroup,
    direct_call,
    register,
)
from dispatchcore.executor import thread_stacks

SRC = Path(__file__).resolve().parents[1] / "src"
BUILTIN_ERRORS = {
    name
    for name in dir(builtins)
    if isinstance(getattr(builtins, name), type) and issubclass(getattr(builtins, name), BaseException)
}

_PROTOCOL = "a __getattr__ answering a private or dunder lookup (copy, pickle, hasattr): the plain error Python expects"
#: (file under src, enclosing function, builtin) -> (how many, why it stays a bare builtin).
ALLOWED: dict[tuple[str, str, str], tuple[int, str]] = {
    ("dispatchcore/_group/_method_proxy.py", "MethodNamespace.__getattr__", "AttributeError"): (1, _PROTOCOL),
    ("dispatchcore/_group/_worker_group.py", "WorkerGroup.__getattr__", "AttributeError"): (1, _PROTOCOL),
    ("dispatchcore/_rows/_lazy_columns.py", "LazyTensorColumns.__getattr__", "AttributeError"): (1, _PROTOCOL),
    ("dispatchcore/_group/_stream.py", "CallStream.__next__", "StopIteration"): (
        1,
        "the iterator protocol: a stream that is over",
    ),
    ("dispatchcore/_spi/_executor_base.py", "Executor.forward_chunk", "NotImplementedError"): (
        1,
        "an optional executor hook the subclass did not implement: Python's convention, for executor authors",
    ),
    ("dispatchcore/_wire/_buffers.py", "reuse_limit_bytes", "ValueError"): (
        1,
        "a malformed DISPATCHCORE_*_MB variable read while _wire is imported; _wire stands under the error "
        "tree, and importing it there would raise the core's import floors past the limit",
    ),
    ("dispatchcore/testing/workers.py", "EchoWorker.fail_on", "ValueError"): (
        1,
        "the test kit's planted failure: stands in for a user's method raising its own exception",
    ),
    ("dispatchcore/testing/workers.py", "FailingInitWorker.__init__", "RuntimeError"): (
        1,
        "the test kit's planted failure: stands in for a user's __init__ raising its own exception",
    ),
    ("dispatchcore/testing/weight_workers.py", "WeightRollout.load_weights", "AssertionError"): (
        1,
        "the test kit's check inside a test worker: a failed assertion, as pytest reports one",
    ),
    ("dispatchcore/_lane/_link.py", "LaneLink.recv", "ConnectionError"): (
        1,
        "a lane socket the peer closed: the OSError family the socket itself raises, which the lane's readers "
        "catch as such",
    ),
    ("executors_torchrun/__init__.py", "__getattr__", "AttributeError"): (1, _PROTOCOL),
}

#: (file under src, class) -> why an exception class defined there does not derive from DispatchError.
ALLOWED_CLASSES: dict[tuple[str, str], str] = {
    ("dispatchcore/_base/_errors.py", "DispatchError"): "the root of the tree",
    ("dispatchcore/_base/_errors.py", "CallInterrupted"): "raised into a cancelled worker method, as "
    "KeyboardInterrupt is: a BaseException a worker's `except Exception` does not swallow",
    ("dispatchcore/testing/modes.py", "ModePropertyError"): "the test kit's failed check: an AssertionError, "
    "which pytest reports as a test failure",
    ("dispatchcore/testing/faults.py", "InjectedFault"): "stands in for a user's own exception in a worker",
}


def _bare_raises(path: Path) -> list[tuple[str, str]]:
    """``(enclosing function, builtin)`` for each ``raise <builtin>`` / ``raise <builtin>(...)`` in ``path``."""
    found: list[tuple[str, str]] = []

    def visit(node: ast.AST, where: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                visit(child, f"{where}.{child.name}" if where else child.name)
                continue
            if isinstance(child, ast.Raise) and child.exc is not None:
                exc = child.exc.func if isinstance(child.exc, ast.Call) else child.exc
                if isinstance(exc, ast.Name) and exc.id in BUILTIN_ERRORS:
                    found.append((where or "<module>", exc.id))
            visit(child, where)

    visit(ast.parse(path.read_text()), "")
    return found


def _scan() -> Counter[tuple[str, str, str]]:
    counts: Counter[tuple[str, str, str]] = Counter()
    for path in sorted(SRC.rglob("*.py")):
        for where, name in _bare_raises(path):
            counts[(path.relative_to(SRC).as_posix(), where, name)] += 1
    return counts


def test_every_raise_in_src_is_a_dispatch_error_or_allowed_with_its_reason() -> None:
    found = _scan()
    unlisted = {key: n for key, n in found.items() if n > ALLOWED.get(key, (0, ""))[0]}
    assert not unlisted, (
        "bare builtin raises: raise the DispatchError subclass that is also that builtin (DispatchValueError, "
        f"DispatchTypeError, DispatchKeyError, ...), or allow it in ALLOWED with its reason: {unlisted}"
    )
    stale = {key for key, (n, _why) in ALLOWED.items() if found.get(key, 0) < n}
    assert not stale, f"allowed raises no longer in src (drop them from ALLOWED): {sorted(stale)}"
    assert all(why for _, why in ALLOWED.values())


def test_every_exception_class_in_src_derives_from_dispatch_error_or_says_why_not() -> None:
    offenders = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ClassDef):
                continue
            bases = [b.id for b in node.bases if isinstance(b, ast.Name)]
            if bases and all(b in BUILTIN_ERRORS for b in bases):
                offenders.append((path.relative_to(SRC).as_posix(), node.name))
    assert sorted(set(offenders) - set(ALLOWED_CLASSES)) == []
    assert sorted(set(ALLOWED_CLASSES) - set(offenders)) == []


def test_every_dispatch_error_class_is_also_a_builtin() -> None:
    for name in dispatchcore.__all__:
        cls = getattr(dispatchcore, name)
        if isinstance(cls, type) and issubclass(cls, DispatchError) and cls is not DispatchError:
            # The builtin (or the standard library's: concurrent.futures.CancelledError) it also is.
            others = [b for b in cls.__mro__ if not b.__module__.startswith("dispatchcore")]
            assert [b for b in others if b not in (Exception, BaseException, object)], name
    assert issubclass(DispatchRuntimeError, RuntimeError) and issubclass(DispatchImportError, ImportError)


# -- the conversions a user meets ----------------------------------------------------------------------


def test_direct_call_and_worker_group_refuse_world_size_zero_alike() -> None:
    with pytest.raises(DispatchValueError, match="world_size must be an int >= 1"):
        direct_call(Dispatch.ONE_TO_ALL, 0, (), {})
    with pytest.raises(DispatchValueError, match="world_size must be an int >= 1"):
        WorkerGroup(Echo, 0)


def test_data_errors_stay_catchable_as_the_protocols_builtins() -> None:
    data = DataProto.from_dict({"x": torch.arange(4)})
    with pytest.raises(DispatchIndexError, match="out of range"):
        data[9]
    with pytest.raises(IndexError):
        data[9]
    with pytest.raises(DispatchKeyError, match="'y' not in TensorBatch"):
        data.batch["y"]
    with pytest.raises(KeyError):
        data.batch["y"]
    assert data.batch.get("y") is None  # Mapping.get still sees a KeyError
    with pytest.raises(DispatchTypeError, match="indexing a DataProto with object"):
        data[object()]  # type: ignore[index]
    with pytest.raises(DispatchValueError, match="padding_size must be >= 0"):
        data.padding(-1)


# -- did-you-mean: WorkerGroup keywords before the backend's options ------------------------------------


class Echo(Worker):
    @register(Dispatch.ONE_TO_ALL)
    def rank_of(self) -> int:
        return self.rank

    @register(Dispatch.DP_COMPUTE_PROTO)
    def double(self, data: DataProto) -> DataProto:
        return DataProto.from_dict({"x": data.batch["x"] * 2})

    @register(Dispatch.ONE_TO_ALL, blocking=False)
    def later(self) -> int:
        return self.rank

    @register(Dispatch.ONE_TO_ALL)
    def nap(self, seconds: float) -> None:
        import time

        time.sleep(seconds)


@pytest.mark.parametrize(
    "keyword",
    [
        n
        for n in inspect.signature(WorkerGroup.__init__).parameters
        if n not in ("self", "worker_cls", "backend_options")
    ]
    + ["name"],  # ``name`` is read off the backend options
)
def test_every_group_keyword_is_looked_for_first(keyword: str) -> None:
    """The list the option check holds follows WorkerGroup's signature: each keyword, misspelt, is suggested."""
    with pytest.raises(DispatchTypeError, match=rf"did you mean the WorkerGroup keyword '{keyword}'\?"):
        WorkerGroup(Echo, 1, **{f"{keyword}x": 1})


@pytest.mark.parametrize(
    ("typo", "meant"),
    [("call_timout", "call_timeout"), ("death_timout", "death_timeout"), ("isolat", "isolate")],
)
def test_a_misspelt_group_keyword_suggests_the_keyword_not_a_backend_option(typo: str, meant: str) -> None:
    with pytest.raises(DispatchTypeError, match=rf"\['{typo}'\].*did you mean the WorkerGroup keyword '{meant}'\?"):
        WorkerGroup(Echo, 1, **{typo: 5})


def test_a_misspelt_backend_option_still_suggests_the_option() -> None:
    with pytest.raises(DispatchTypeError, match=r"\['start_timout'\] for the 'local' backend \(did you mean "):
        WorkerGroup(Echo, 1, start_timout=5)
    with pytest.raises(DispatchTypeError, match=r"did you mean 'start_timeout'\?"):
        WorkerGroup(Echo, 1, start_timout=5)


# -- .options(): typos, values, blocking=False --------------------------------------------------------


@pytest.fixture(scope="module")
def group() -> Any:
    with WorkerGroup(Echo, 2) as wg:
        yield wg


@pytest.mark.parametrize(
    ("options", "error", "pattern"),
    [
        ({"timout": 5}, DispatchTypeError, r"unknown keyword\(s\) \['timout'\] \(did you mean 'timeout'\?\)"),
        ({"call_timeout": 5}, DispatchTypeError, r"\['call_timeout'\] \(did you mean 'timeout'\?\)"),
        ({"on_timeout": "cancle"}, DispatchValueError, r"got 'cancle' \(did you mean 'cancel'\?\)"),
        ({"timeout": 0}, DispatchValueError, r"timeout must be a positive number of seconds or None, got 0"),
        ({"timeout": True}, DispatchValueError, r"timeout must be a positive number"),
        ({"lazy": "yes"}, DispatchValueError, r"lazy must be True, False or None"),
        ({"blocking": "no"}, DispatchValueError, r"blocking must be True, False or None, got 'no'"),
    ],
    ids=["typo", "group-keyword", "on_timeout", "timeout=0", "timeout=True", "lazy", "blocking"],
)
def test_options_refuses_a_typo_or_a_bad_value_with_a_hint(
    group: Any, options: dict[str, Any], error: type[Exception], pattern: str
) -> None:
    with pytest.raises(error, match=pattern):
        group.rank_of.options(**options)


def test_options_blocking_false_returns_a_future_as_register_does(group: Any) -> None:
    future = group.rank_of.options(blocking=False)()
    assert isinstance(future, dispatchcore.CallFuture) and future.get() == [0, 1]
    data = DataProto.from_dict({"x": torch.arange(4)})
    proto_future = group.double.options(blocking=False)(data)
    assert isinstance(proto_future, DataProtoFuture)
    assert proto_future.get().batch["x"].tolist() == [0, 2, 4, 6]
    assert group.later.options(blocking=True)() == [0, 1]  # and back: a blocking=False method waits
    assert isinstance(group.later(), dispatchcore.CallFuture)  # the proxy itself is unchanged


# -- options a backend cannot honour ---------------------------------------------------------------------


def test_replace_on_a_backend_that_cannot_is_refused_naming_those_that_can() -> None:
    with pytest.raises(DispatchValueError, match=r"on_rank_death='replace'.*'local' cannot") as info:
        WorkerGroup(Echo, 1, on_rank_death="replace")
    able = str(info.value).split("Backends that can: ")[1]
    assert "local" not in able.split(".")[0]
    for backend in ("ray", "torchrun", "multiprocess"):
        if backend in dispatchcore.available_backends():
            assert backend in able, able


def test_a_misspelt_on_rank_death_suggests_replace_and_names_every_backend_that_can() -> None:
    with pytest.raises(DispatchValueError, match=r"got 'replce' \(did you mean 'replace'\?\)") as info:
        WorkerGroup(Echo, 1, on_rank_death="replce")
    for backend in ("ray", "torchrun", "multiprocess"):
        if backend in dispatchcore.available_backends():
            assert backend in str(info.value), str(info.value)


# -- a non-DataProto to a DataProto mode ------------------------------------------------------------------


@pytest.mark.parametrize("value", [{"x": torch.arange(4)}, torch.arange(4)], ids=["dict", "tensor"])
def test_a_non_dataproto_to_a_dataproto_mode_is_a_type_error_naming_the_type(group: Any, value: Any) -> None:
    with pytest.raises(
        DispatchTypeError, match=rf"none of its arguments is a DataProto.*\(got {type(value).__name__}\)"
    ):
        group.double(value)
    with pytest.raises(TypeError):
        group.double(value)
    assert not issubclass(DispatchTypeError, BatchSizeError)


# -- stack notes start at the user's frames ---------------------------------------------------------------


def test_a_stack_note_starts_at_the_users_code_and_counts_the_import_system(tmp_path: Path) -> None:
    # Sleeps in short steps, so the cancel that ends the call stops it at once.
    (tmp_path / "slow_module_for_stacks.py").write_text("import time\nfor _ in range(300):\n    time.sleep(0.1)\n")
    sys.path.insert(0, str(tmp_path))
    try:
        with WorkerGroup(Importer, 1) as wg:
            with pytest.raises(DispatchTimeoutError) as info:
                wg.load.options(timeout=1.5, on_timeout="cancel")()
            notes = "\n".join(getattr(info.value, "__notes__", []))
    finally:
        sys.path.remove(str(tmp_path))
    stack = notes.split("running the worker's methods:\n", 1)[1]
    first = stack.splitlines()[0]
    assert "frames of the method thread's machinery" in first, stack
    assert "threading.py" not in stack and "_bootstrap" not in stack, stack
    assert "in load" in stack.splitlines()[1], stack
    assert "frames of the import system" in stack and "slow_module_for_stacks.py" in stack, stack


class Importer(Worker):
    @register(Dispatch.RANK_ZERO)
    def load(self) -> None:
        import slow_module_for_stacks  # noqa: F401 - sleeps while imported


def test_a_stack_with_no_user_frame_shows_whole() -> None:
    event = threading.Event()
    waiter = threading.Thread(target=event.wait, daemon=True)
    waiter.start()
    try:
        assert waiter.ident is not None
        text = thread_stacks(waiter.ident)
    finally:
        event.set()
        waiter.join()
    assert "threading.py" in text and "machinery" not in text, text


# -- the console script ------------------------------------------------------------------------------------


def test_console_help_has_no_sphinx_roles() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "dispatchcore._cli", "--help"], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    assert ":mod:" not in out and "`" not in out and "exit with status 2" in out
