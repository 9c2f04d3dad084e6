"""The names DESIGN.md promises are importable from ``dispatchcore``; ``__all__`` is complete."""

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

DESIGN_NAMES = """
register Dispatch Execute register_dispatch_mode update_dispatch_mode unregister_dispatch_mode
make_nd_compute_dataproto_dispatch_fn DataProto DataProtoFuture pad_dataproto_to_divisor unpad_dataproto
fold_batch_dim unfold_batch_dim Worker WorkerGroup create_colocated_worker_cls colocate available_backends
DispatchError RegistrationError BatchSizeError BackendNotFoundError WorkerError WorkerDiedError
DispatchTimeoutError hookimpl Executor trace
""".split()


def test_design_names_are_exported() -> None:
    missing = [n for n in DESIGN_NAMES if n not in dispatchcore.__all__]
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
