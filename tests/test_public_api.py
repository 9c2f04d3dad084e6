"""The names docs/design.md ("Public names") promises are importable from ``dispatchcore``; ``__all__`` is complete."""

from __future__ import annotations

import types

import dispatchcore
from dispatchcore import (
    BackendNotFoundError,
    BatchSizeError,
    DispatchError,
    DispatchTimeoutError,
    RegistrationError,
    WorkerDiedError,
    WorkerError,
)

PUBLIC_NAMES = """
register Dispatch Execute register_dispatch_mode update_dispatch_mode unregister_dispatch_mode
make_nd_compute_dataproto_dispatch_fn DataProto DataProtoFuture pad_dataproto_to_divisor unpad_dataproto
fold_batch_dim unfold_batch_dim Worker WorkerGroup create_colocated_worker_cls colocate available_backends
DispatchError RegistrationError BatchSizeError BackendNotFoundError WorkerError WorkerDiedError
DispatchTimeoutError hookimpl Executor trace
""".split()


def test_design_names_are_exported() -> None:
    missing = [n for n in PUBLIC_NAMES if n not in dispatchcore.__all__]
    assert not missing


def test_all_is_complete() -> None:
    public = {
        name
        for name, value in vars(dispatchcore).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }
    assert public == set(dispatchcore.__all__) - {"__version__"}


def test_error_tree_subclasses_builtins() -> None:
    assert issubclass(RegistrationError, ValueError) and issubclass(RegistrationError, DispatchError)
    assert issubclass(BatchSizeError, ValueError)
    assert issubclass(BackendNotFoundError, LookupError)
    assert issubclass(WorkerError, RuntimeError) and issubclass(WorkerDiedError, RuntimeError)
    assert issubclass(DispatchTimeoutError, TimeoutError)
    err = WorkerError(2, "update_actor", "Traceback...\nValueError: bad", "ValueError", "bad")
    assert "rank 2" in str(err) and "ValueError: bad" in str(err) and "update_actor" in str(err)
    import pickle

    again = pickle.loads(pickle.dumps(err))
    assert (again.rank, again.method, again.remote_traceback) == (2, "update_actor", err.remote_traceback)
    died = pickle.loads(pickle.dumps(WorkerDiedError(1, "exit code 3", "step")))
    assert "rank 1" in str(died) and "exit code 3" in str(died)


def test_py_typed_ships() -> None:
    from importlib.resources import files

    assert files("dispatchcore").joinpath("py.typed").is_file()


def test_ci_runs_exactly_the_readme_test_command() -> None:
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    readme = (root / "README.md").read_text().splitlines()
    marker = readme.index("<!-- test-command -->")
    command = readme[marker + 2]  # the line after the opening fence
    assert command.startswith("pip install") and "pytest" in command
    assert command in (root / ".ci" / "run").read_text().splitlines()


def _private_core_uses(source: str) -> list[tuple[int, str]]:
    """Imports of private core modules, and private attributes of core objects."""
    import ast

    from dispatchcore import Executor, WorkerGroup

    def private(cls: type, fields: set[str]) -> set[str]:
        return {n for n in vars(cls) if n.startswith("_") and not n.startswith("__")} | fields

    # The private names each core class defines (methods, and the fields its set-up assigns), read off the
    # classes so that a redesign of the core keeps the check current.  An executor's own private fields
    # are its own; verl's private names, which the verl adapter defines for verl's code, are not the core's.
    group_private = private(WorkerGroup, {"_site", "_worker_cls", "_methods", "_parent", "_mesh_cache", "_lock"})
    group_private |= {"_executor", "_prefix", "_check_open"}  # the names of the core before its redesign
    executor_private = private(Executor, {"_broken"})
    core_private = group_private | executor_private
    group_bases = {"WorkerGroup", "RayWorkerGroup"}
    tree = ast.parse(source)
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("dispatchcore._"):
            found.append((node.lineno, f"imports {node.module}"))
        if isinstance(node, ast.Import):
            found += [(node.lineno, f"imports {a.name}") for a in node.names if a.name.startswith("dispatchcore._")]
        if isinstance(node, ast.Attribute) and node.attr == "_dispatchcore_roles":
            found.append((node.lineno, "reads _dispatchcore_roles"))
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        bases = {getattr(b, "id", getattr(b, "attr", "")) for b in cls.bases}
        for item in cls.body:  # overriding a private core method is reaching into the core too
            if isinstance(item, ast.FunctionDef) and bases & group_bases and item.name in group_private:
                found.append((item.lineno, f"overrides WorkerGroup.{item.name}"))
        for node in ast.walk(cls):
            if not (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)):
                continue
            owner, attr = node.value.id, node.attr
            if owner in {"wg", "group", "worker_group"} and attr in core_private:
                found.append((node.lineno, f"uses {owner}.{attr}"))
            elif owner == "self" and attr == "_executor" and bases & group_bases:
                found.append((node.lineno, "uses WorkerGroup._executor"))
            elif (
                owner == "self" and attr in group_private - {"_executor"} and bases & {"WorkerGroup", "RayWorkerGroup"}
            ):
                found.append((node.lineno, f"uses self.{attr}"))
            elif owner == "self" and attr in executor_private and "Executor" in bases:
                found.append((node.lineno, f"uses self.{attr}"))
    return found


def test_executors_use_only_public_core_names() -> None:
    """docs/design.md, "The executor contract": the built-in executors and the example plugin need nothing private."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    folders = [*sorted((root / "src").glob("executors_*")), root / "examples" / "executor_plugin"]
    found = [
        f"{path.relative_to(root)}:{line}: {what}"
        for folder in folders
        for path in sorted(folder.rglob("*.py"))
        for line, what in _private_core_uses(path.read_text())
    ]
    assert not found, "private core names used by an executor:\n" + "\n".join(found)


def test_the_private_name_check_finds_each_kind() -> None:
    bad = """
import dispatchcore._runtime._isolation
from dispatchcore._spi._executor_base import timeout_error
from ._executor import Fine

class Group(RayWorkerGroup):
    def f(self):
        return self._executor, self._prefix, self._check_open(), self._site

    def _attach(self, *args):
        pass

class Mine(Executor):
    def f(self, wg):
        return self._broken, wg._executor, self._executor_of_mine, self.worker_cls._dispatchcore_roles
"""
    found = [what for _, what in _private_core_uses(bad)]
    assert sorted(found) == sorted(
        [
            "imports dispatchcore._runtime._isolation",
            "imports dispatchcore._spi._executor_base",
            "uses WorkerGroup._executor",
            "uses self._prefix",
            "uses self._check_open",
            "uses self._site",
            "overrides WorkerGroup._attach",
            "uses self._broken",
            "uses wg._executor",
            "reads _dispatchcore_roles",
        ]
    ), found


def test_executor_contract_modules_export_what_they_document() -> None:
    import dispatchcore.executor as executor
    import dispatchcore.wire as wire

    for module in (executor, wire):
        missing = [n for n in module.__all__ if not hasattr(module, n)]
        assert not missing, f"{module.__name__} lacks {missing}"
    assert executor.Executor is dispatchcore.Executor and executor.WorkerHost is dispatchcore.WorkerHost
