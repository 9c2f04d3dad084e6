"""Entry point of the ``multiprocess`` backend (group ``dispatchcore`` in pyproject.toml).

An entry point's module must import nothing heavy: the executor is imported
when dispatchcore runs the hook, and its needs (``requires``) are checked
without importing them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dispatchcore import hookimpl


@hookimpl
def dispatchcore_register_executors(register: Callable[[type[Any]], None]) -> None:
    from ._executor import MultiprocessExecutor

    register(MultiprocessExecutor)
