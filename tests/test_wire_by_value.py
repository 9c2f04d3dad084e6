"""Code that travels: what a rank cannot import by name goes by value, the rest by name.

This module is itself the case the rule exists for: pytest put ``tests/`` on
the driver's ``sys.path``, no rank process has it, so the worker class below
reaches every backend's ranks by value.
"""

from __future__ import annotations

import importlib
import json
import os
import pickle
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

import dispatchcore
from dispatchcore import Dispatch, Worker, WorkerGroup, available_backends, register, wire

pytestmark = pytest.mark.timeout(240)

SRC = Path(__file__).resolve().parent.parent / "src"


@dataclass
class Box:
    """A value whose class exists only in this module."""

    value: int


def triple(x: int) -> int:
    return 3 * x


class Scaler:
    def __init__(self, k: int) -> None:
        self.k = k

    def apply(self, x: int) -> int:
        return x * self.k


class TestModuleWorker(Worker):
    """A worker class defined in a test module, with helpers from the same module."""

    __test__ = False  # not a test class, whatever its name

    def __init__(self, k: int) -> None:
        self.scaler = Scaler(k)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def scale(self, x: int) -> int:
        return self.scaler.apply(x) + self.rank

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def run_fn(self, fn: Any, x: int) -> Any:
        return fn(x)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def box(self, x: int) -> Box:
        return Box(x + self.rank)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def fail(self) -> None:
        raise ValueError("from the test module")  # FAIL-LINE

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def imported_by_name(self) -> tuple[int, bool]:
        """This rank's process, and whether it imported this test module (or received the code instead)."""
        return os.getpid(), __name__ in sys.modules


# ---- the decision ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["json", "torch", "torch._C._autograd", "dispatchcore", "pytest", "cloudpickle"])
def test_installed_and_standard_modules_go_by_name(name: str) -> None:
    assert wire.importable_by_name(importlib.import_module(name))


def test_a_module_on_a_path_inserted_at_run_time_goes_by_value(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "late_helpers_dc.py").write_text("def f(x):\n    return x + 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("late_helpers_dc")
    monkeypatch.delitem(sys.modules, "late_helpers_dc")  # leave no module behind for later tests
    assert not wire.importable_by_name(module)


def test_this_test_module_and_main_go_by_value() -> None:
    assert not wire.importable_by_name(sys.modules[__name__])
    assert __name__ in wire.by_value_modules()
    assert not wire.importable_by_name(sys.modules["__main__"])
    assert "dispatchcore" not in wire.by_value_modules()


def test_installed_code_keeps_the_c_pickler_stream() -> None:
    """The fast path is kept when the stream names only importable code: byte for byte the plain pickle."""
    value = {"fn": json.dumps, "t": torch.arange(3), "cls": dispatchcore.DataProto}
    fast = wire.dumps(value, share_callables=True)  # the C pickler: every callable by name
    assert not fast.shared
    assert wire.dumps_portable(value).data == fast.data


def test_test_module_code_leaves_the_c_pickler_stream() -> None:
    value = {"fn": triple}
    fast = wire.dumps(value, share_callables=True)
    assert __name__.encode() in fast.data  # by name: no rank could load it
    assert wire.dumps_portable(value).data != fast.data
    assert wire.dumps_portable(value).data == wire.dumps(value).data  # cloudpickle, the code by value


def _load_elsewhere(payload: wire.Serialized, code: str) -> str:
    """Unpickle ``payload`` in a fresh interpreter whose path has ``src`` only, run ``code`` on it as ``v``."""
    script = (
        "import pickle, sys\n"
        "from dispatchcore import wire\n"
        "data, buffers = pickle.load(sys.stdin.buffer)\n"
        "v = wire.loads(wire.Serialized(data, buffers))\n"
        f"print(repr(({code})))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    stdin = pickle.dumps((payload.data, [bytes(b.raw()) for b in payload.buffers]))
    done = subprocess.run(
        [sys.executable, "-c", script], input=stdin, capture_output=True, env=env, cwd="/", timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr.decode()
    return done.stdout.decode().strip()


@pytest.mark.parametrize("dump", [wire.dumps, wire.dumps_portable], ids=["dumps", "dumps_portable"])
def test_test_module_code_reaches_a_process_that_cannot_import_it(dump: Any) -> None:
    payload = dump({"cls": TestModuleWorker, "fn": triple, "box": Box(4), "t": torch.arange(4)})
    out = _load_elsewhere(
        payload,
        "v['fn'](5), v['box'].value, v['cls'].__name__, v['t'].sum().item(), "
        f"{__name__!r} in sys.modules, 'torch' in sys.modules",
    )
    assert out == "(15, 4, 'TestModuleWorker', 6, False, True)"


# ---- on every backend -----------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["local", "ray", "torchrun"])
def test_a_worker_class_from_a_test_module_runs(backend: str, request: pytest.FixtureRequest) -> None:
    if backend not in available_backends():
        pytest.skip(f"{backend} backend unavailable")
    if backend == "ray":
        request.getfixturevalue("ray_session")
    with WorkerGroup(TestModuleWorker, 2, backend=backend, init_args=(10,)) as wg:
        # A rank in the driver's process sees the module; one in another process received the code instead.
        seen = wg.imported_by_name()
        assert [imported for _, imported in seen] == [pid == os.getpid() for pid, _ in seen]
        assert wg.scale(2) == [20, 21]
        assert wg.run_fn(triple, 7) == [21, 21]
        assert wg.run_fn(lambda x: Box(x), 1) == [Box(1), Box(1)]
        boxes = wg.box(5)
        assert boxes == [Box(5), Box(6)]
        assert all(type(b) is Box for b in boxes)  # the driver gets its own class back
        # Code that went by value keeps its file name: the rank's frames point at this file and line.
        with pytest.raises(dispatchcore.WorkerError) as info:
            wg.fail()
        line = next(i for i, text in enumerate(Path(__file__).read_text().splitlines(), 1) if "# FAIL-LINE" in text)
        assert f'File "{__file__}", line {line}, in fail' in info.value.remote_traceback
        assert "<dynamic-code>" not in info.value.remote_traceback


_shared_gate = threading.Event()


class GateSharingWorker(Worker):
    """Shares a module-level event with its test: fine when the ranks are threads of this process."""

    @register(Dispatch.ONE_TO_ALL)
    def gate_is_set(self) -> bool:
        return _shared_gate.is_set()


def test_local_checks_test_module_code_by_name_but_a_process_backend_would_send_it() -> None:
    """``local``'s ranks import this module as the driver did; a fresh process could not, so it travels by value."""
    with pytest.raises(TypeError, match="lock"):
        wire.dumps(GateSharingWorker)  # by value: the module-level event goes with the method
    _shared_gate.set()
    try:
        with WorkerGroup(GateSharingWorker, 2, backend="local") as group:
            assert group.gate_is_set() == [True, True]
    finally:
        _shared_gate.clear()
