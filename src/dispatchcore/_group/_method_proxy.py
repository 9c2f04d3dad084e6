"""Per-method proxies bound on a WorkerGroup.

Each ``@register`` method gets its own proxy class *named after the
method*, whose ``__call__`` code object is renamed too, so a traceback
through ``wg.update_actor(batch)`` reads ``update_actor`` rather than an
anonymous wrapper.

``MethodProxy[P, D]`` is generic in the worker method's parameters and the
call's result, so ``wg.call.update_actor`` type-checks (see ``_typed_method``).
"""

from __future__ import annotations

import types
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar

if TYPE_CHECKING:
    from .._dispatch._register import Registration
    from ._worker_group import WorkerGroup

P = ParamSpec("P")
D_co = TypeVar("D_co", covariant=True)

#: Sentinel: "use the group's call_timeout" (typed Any so it can default any parameter).
DEFAULT: Any = object()


class MethodProxy(Generic[P, D_co]):
    """Calls one registered worker method through its group's dispatch mode.

    ``P`` are the worker method's parameters after ``self``; ``D_co`` is what
    the call returns (the mode's collected result, or a future of it).
    """

    __slots__ = ("_group", "_lazy", "_name", "_registration", "_timeout")

    def __init__(
        self,
        group: WorkerGroup[Any],
        name: str,
        registration: Registration,
        timeout: Any = DEFAULT,
        lazy: bool | None = None,
    ):
        self._group = group
        self._name = name
        self._registration = registration
        self._timeout = timeout
        self._lazy = lazy

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> D_co:
        result: D_co = self._group._call_method(
            self._name, self._registration, args, kwargs, self._timeout, lazy=self._lazy
        )
        return result

    def options(self, *, timeout: float | None = DEFAULT, lazy: bool | None = None) -> MethodProxy[P, D_co]:
        """This method with per-call settings, e.g. ``wg.step.options(timeout=5)(x)``.

        ``lazy=True`` keeps this call's DataProto result on the ranks (a ``LazyDataProto``).
        """
        if timeout is not DEFAULT and timeout is not None:
            if not isinstance(timeout, (int, float)) or timeout <= 0:
                raise ValueError(f"timeout must be a positive number of seconds or None, got {timeout!r}")
        if lazy is not None and not isinstance(lazy, bool):
            raise ValueError(f"lazy must be True, False or None, got {lazy!r}")
        return type(self)(self._group, self._name, self._registration, timeout, lazy)

    @property
    def registration(self) -> Registration:
        return self._registration

    def __repr__(self) -> str:
        mode = getattr(self._registration.dispatch_mode, "name", self._registration.dispatch_mode)
        return f"<{self._name} of {self._group!r}: dispatch {mode}>"


def proxy_class(name: str) -> type[MethodProxy[..., Any]]:
    """A MethodProxy subclass named ``name`` whose ``__call__`` shows as ``name``."""
    base_call = MethodProxy.__call__
    code = base_call.__code__.replace(co_name=name, co_qualname=f"{name}.__call__")
    call = types.FunctionType(code, base_call.__globals__, name, base_call.__defaults__, base_call.__closure__)
    call.__qualname__ = f"{name}.__call__"
    return type(name, (MethodProxy,), {"__slots__": (), "__call__": call, "__qualname__": name})


class MethodNamespace:
    """``wg.call``: the group's method proxies as attributes (see ``WorkerGroup.call``)."""

    __slots__ = ("_group",)

    def __init__(self, group: WorkerGroup[Any]) -> None:
        self._group = group

    def __getattr__(self, name: str) -> MethodProxy[..., Any]:
        group = self._group
        if name in group._methods:
            proxy: MethodProxy[..., Any] = getattr(group, name)
            return proxy
        if callable(getattr(group.worker_cls, name, None)):
            group.__getattr__(name)  # raises: "decorate it with @register"
        raise AttributeError(
            f"{group.worker_cls.__name__} has no @register method {name!r}; its registered methods are "
            f"{group.method_names}"
        )

    def __dir__(self) -> list[str]:
        return self._group.method_names

    def __repr__(self) -> str:
        return f"<methods of {self._group!r}>"
