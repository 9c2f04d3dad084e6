"""Per-method proxies bound on a WorkerGroup.

Each ``@register`` method gets its own proxy class *named after the
method*, whose ``__call__`` code object is renamed too, so a traceback
through ``wg.update_actor(batch)`` reads ``update_actor`` rather than an
anonymous wrapper.
"""

from __future__ import annotations

import types
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._register import Registration
    from ._worker_group import WorkerGroup

#: Sentinel: "use the group's call_timeout".
DEFAULT = object()


class MethodProxy:
    """Calls one registered worker method through its group's dispatch mode."""

    __slots__ = ("_group", "_name", "_registration", "_timeout")

    def __init__(self, group: WorkerGroup[Any], name: str, registration: Registration, timeout: Any = DEFAULT):
        self._group = group
        self._name = name
        self._registration = registration
        self._timeout = timeout

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._group._call_method(self._name, self._registration, args, kwargs, self._timeout)

    def options(self, *, timeout: float | None = DEFAULT) -> MethodProxy:  # type: ignore[assignment]
        """This method with per-call settings, e.g. ``wg.step.options(timeout=5)(x)``."""
        if timeout is not DEFAULT and timeout is not None:
            if not isinstance(timeout, (int, float)) or timeout <= 0:
                raise ValueError(f"timeout must be a positive number of seconds or None, got {timeout!r}")
        return type(self)(self._group, self._name, self._registration, timeout)

    @property
    def registration(self) -> Registration:
        return self._registration

    def __repr__(self) -> str:
        mode = getattr(self._registration.dispatch_mode, "name", self._registration.dispatch_mode)
        return f"<{self._name} of {self._group!r}: dispatch {mode}>"


def proxy_class(name: str) -> type[MethodProxy]:
    """A MethodProxy subclass named ``name`` whose ``__call__`` shows as ``name``."""
    base_call = MethodProxy.__call__
    code = base_call.__code__.replace(co_name=name, co_qualname=f"{name}.__call__")
    call = types.FunctionType(code, base_call.__globals__, name, base_call.__defaults__, base_call.__closure__)
    call.__qualname__ = f"{name}.__call__"
    return type(name, (MethodProxy,), {"__slots__": (), "__call__": call, "__qualname__": name})
