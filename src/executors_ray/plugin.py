"""Entry point of the ``ray`` backend (group ``dispatchcore``); imports no ray."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dispatchcore import hookimpl


@hookimpl
def dispatchcore_register_executors(register: Callable[[type[Any]], None]) -> None:
    from ._executor import RayExecutor

    register(RayExecutor)
