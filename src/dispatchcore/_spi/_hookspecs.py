"""Hook specifications a dispatchcore plugin may implement (see docs/executor-contract.md)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pluggy

PROJECT = "dispatchcore"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


class ExecutorHookSpecs:
    """The hooks dispatchcore calls on plugins."""

    @hookspec
    def dispatchcore_register_executors(self, register: Callable[[type[Any]], None]) -> None:
        """Call ``register(executor_cls)`` for every executor this plugin brings."""
