"""Hook specifications a dispatchcore plugin may implement.

Writing an executor plugin
--------------------------
1. Subclass :class:`dispatchcore.Executor`, set ``name`` (the backend name
   users pass as ``backend=``), ``extra``/``requires`` if it needs optional
   packages, and implement ``__init__``, ``submit`` and ``shutdown``.  Keep
   heavy imports (ray, torch.distributed) inside methods.
2. In a plugin module, implement the hook::

       from dispatchcore import hookimpl

       @hookimpl
       def dispatchcore_register_executors(register):
           from my_pkg.executor import MyExecutor
           register(MyExecutor)

3. Point an entry point of group ``dispatchcore`` at that module::

       [project.entry-points.dispatchcore]
       mybackend = "my_pkg.plugin"

``WorkerGroup(..., backend="mybackend")`` then finds it; built-in executors
are loaded by exactly this path.  ``DISPATCHCORE_DISABLED_PLUGINS=a,b``
skips plugins by entry-point name.
"""

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
