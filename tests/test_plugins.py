"""Unit test of the plugin registry internals (reset, per-plugin status): imports dispatchcore._spi._plugins directly.

Executors are found through the ``dispatchcore`` entry-point group, as a third party's would be.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

import dispatchcore
from dispatchcore import BackendNotFoundError, WorkerGroup, available_backends
from dispatchcore._spi._plugins import registry
from dispatchcore.testing.workers import EchoWorker

SERIAL_EXECUTOR = '''
"""A throwaway executor: ranks built in the caller's thread, calls run one after another."""
from dispatchcore import CallHandle, Executor, WorkerHost


class _Done(CallHandle):
    def __init__(self, outcomes):
        self.outcomes = outcomes

    def done(self):
        return True

    def result(self, timeout=None):
        for ok, value in self.outcomes:
            if not ok:
                raise value.to_error()
        return [value for _, value in self.outcomes]


class SerialExecutor(Executor):
    name = "serial"

    def __init__(self, spec):
        super().__init__(spec)
        self.hosts = [WorkerHost(spec.worker_cls, r, spec.world_size, spec.init_args, dict(spec.init_kwargs))
                      for r in range(spec.world_size)]
        for host in self.hosts:
            failure = host.start()
            if failure is not None:
                raise failure.to_error()

    def submit(self, call):
        return _Done([self.hosts[r].run(call.method, a, k) for r, a, k in zip(call.ranks, call.args, call.kwargs)])

    def shutdown(self):
        pass


class NeedsMissingExtra(Executor):
    name = "needs_extra"
    extra = "fancy"
    requires = ("dispatchcore_no_such_module_xyz",)

    def submit(self, call):
        raise AssertionError

    def shutdown(self):
        pass
'''

PLUGIN = """
from dispatchcore import hookimpl


@hookimpl
def dispatchcore_register_executors(register):
    from thirdparty_exec.executor import NeedsMissingExtra, SerialExecutor
    register(SerialExecutor)
    register(NeedsMissingExtra)
"""


@pytest.fixture
def third_party(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Install a plugin distribution outside the repo: a package plus its dist-info."""
    pkg = tmp_path / "thirdparty_exec"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "executor.py").write_text(SERIAL_EXECUTOR)
    (pkg / "plugin.py").write_text(PLUGIN)
    (tmp_path / "broken_exec.py").write_text("raise ImportError('planted: this plugin cannot load')\n")
    info = tmp_path / "thirdparty_exec-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: thirdparty-exec\nVersion: 0.1\nProvides-Extra: gpu\n"
        'Requires-Dist: dispatchcore-absent-dep>=1; extra == "gpu"\n'
    )
    (tmp_path / "needs_dep_exec.py").write_text("import dispatchcore_absent_dep  # provided by the 'gpu' extra\n")
    (info / "entry_points.txt").write_text(
        "[dispatchcore]\nserial = thirdparty_exec.plugin\nbroken = broken_exec\ngpu = needs_dep_exec\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    registry.reset()
    yield tmp_path
    registry.reset()
    for name in [m for m in sys.modules if m.startswith(("thirdparty_exec", "broken_exec", "needs_dep_exec"))]:
        del sys.modules[name]


def test_third_party_executor_is_found_and_used_by_name(third_party: Path) -> None:
    assert "serial" in available_backends()
    with WorkerGroup(EchoWorker, 3, backend="serial") as wg:
        assert wg.backend == "serial"
        assert [i["rank"] for i in wg.info()] == [0, 1, 2]
        assert wg.dp_compute([1, 2, 3]) == [(0, (1,), {}), (1, (2,), {}), (2, (3,), {})]


def test_broken_plugin_does_not_break_others(third_party: Path) -> None:
    assert "local" in available_backends() and "serial" in available_backends()
    with pytest.raises(BackendNotFoundError, match="planted: this plugin cannot load"):
        WorkerGroup(EchoWorker, 2, backend="broken")


def test_missing_extra_names_the_pip_line(third_party: Path) -> None:
    with pytest.raises(BackendNotFoundError) as info:
        WorkerGroup(EchoWorker, 2, backend="needs_extra")
    message = str(info.value)
    assert 'pip install "thirdparty-exec[fancy]"' in message
    assert "dispatchcore_no_such_module_xyz" in message
    assert "needs_extra" not in available_backends()


def test_plugin_missing_its_extra_names_the_pip_line(third_party: Path) -> None:
    statuses = {b.name: b.status for b in registry.all()}
    assert statuses["gpu"] == 'missing dispatchcore_absent_dep: pip install "thirdparty-exec[gpu]"'
    with pytest.raises(BackendNotFoundError, match=r'Run: pip install "thirdparty-exec\[gpu\]"'):
        WorkerGroup(EchoWorker, 2, backend="gpu")


def test_unknown_backend_lists_available(third_party: Path) -> None:
    with pytest.raises(BackendNotFoundError) as info:
        WorkerGroup(EchoWorker, 2, backend="nope")
    assert "'nope'" in str(info.value) and "local" in str(info.value)
    assert isinstance(info.value, LookupError)


def test_disabled_plugins_are_skipped(third_party: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DISPATCHCORE_DISABLED_PLUGINS", "serial, broken")
    registry.reset()
    assert "serial" not in available_backends()
    statuses = {b.name: b.status for b in registry.all()}
    assert "disabled" in statuses["serial"]
    assert "local" in available_backends()


def test_builtin_executors_come_through_entry_points() -> None:
    registry.reset()
    infos = {b.name: b for b in registry.all()}
    assert infos["local"].plugin == "local" and infos["local"].distribution == "dispatchcore"
    assert {"local", "ray", "torchrun"} <= set(infos)


def test_hookimpl_marker_is_exported() -> None:
    assert dispatchcore.hookimpl.project_name == "dispatchcore"


def test_cli_lists_backends() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "dispatchcore._cli", "backends"], capture_output=True, text=True, check=True
    ).stdout
    assert out.splitlines()[0].split()[:3] == ["backend", "package", "status"]
    line = next(row for row in out.splitlines() if row.startswith("local "))
    assert "available" in line and "dispatchcore" in line


def test_import_does_not_import_ray() -> None:
    code = textwrap.dedent(
        """
        import sys, dispatchcore
        from dispatchcore._spi._plugins import registry
        registry.all()
        assert 'ray' not in sys.modules, 'importing dispatchcore (and loading plugins) imported ray'
        """
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_register_executor_in_process() -> None:
    """A notebook or benchmark registers a class directly; a second class under the name is refused."""
    from dispatchcore import RegistrationError, WorkerGroup
    from dispatchcore.executor import Call, CallHandle, Executor, register_executor
    from dispatchcore.testing.workers import EchoWorker

    class _Done(CallHandle):
        def __init__(self, call: Call) -> None:
            self.values = [args[0] if args else None for args in call.args]

        def result(self, timeout: float | None = None) -> list[object]:
            return self.values

        def done(self) -> bool:
            return True

    class EchoOnDriver(Executor):
        name = "test-in-process-echo"

        def submit(self, call: Call) -> CallHandle:
            return _Done(call)

        def shutdown(self) -> None:
            pass

    register_executor(EchoOnDriver)
    register_executor(EchoOnDriver)  # the same class again: nothing to do
    with WorkerGroup(EchoWorker, 2, backend="test-in-process-echo") as wg:
        assert wg.backend == "test-in-process-echo"
        assert wg.execute_all("anything", 7) == [7, 7]
    other = type("Other", (EchoOnDriver,), {})
    with pytest.raises(RegistrationError, match="registered twice"):
        register_executor(other)
