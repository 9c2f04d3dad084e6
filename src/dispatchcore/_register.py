"""The ``@register`` decorator: how a worker method is dispatched and run.

Like pluggy's markers it stores its options on the function under one
attribute and validates them when applied, so a bad mode fails when the
worker module is imported, not at the first call.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar, overload

from ._errors import RegistrationError
from ._modes import Dispatch, Execute, validate_mode

F = TypeVar("F", bound=Callable[..., Any])

#: Attribute under which ``@register`` stores a method's :class:`Registration`.
REGISTRATION_ATTR = "__dispatchcore_registration__"


@dataclass(frozen=True)
class Registration:
    """Options of one registered worker method."""

    dispatch_mode: Any
    execute_mode: Execute
    blocking: bool
    materialize_futures: bool
    is_async: bool = False


@overload
def register(dispatch_mode: F) -> F: ...


@overload
def register(
    dispatch_mode: Any = ...,
    execute_mode: Any = ...,
    blocking: bool = ...,
    materialize_futures: bool = ...,
) -> Callable[[F], F]: ...


def register(
    dispatch_mode: Any = None,
    execute_mode: Any = None,
    blocking: bool = True,
    materialize_futures: bool = True,
) -> Any:
    """Mark a worker method as callable through a ``WorkerGroup``.

    ``dispatch_mode`` (default ``Dispatch.ALL_TO_ALL``) says how arguments are
    split over ranks and results gathered; ``execute_mode`` (default
    ``Execute.ALL``) which ranks run it; ``blocking=False`` makes the call
    return a future at once.  Usable bare (``@register``) or with options.
    """
    if inspect.isfunction(dispatch_mode) and execute_mode is None:
        return register()(dispatch_mode)
    mode = Dispatch.ALL_TO_ALL if dispatch_mode is None else dispatch_mode
    execute = Execute.ALL if execute_mode is None else execute_mode
    validate_mode(mode)
    if not isinstance(execute, Execute):
        raise RegistrationError(f"execute_mode must be Execute.ALL or Execute.RANK_ZERO, got {execute!r}")
    for label, flag in (("blocking", blocking), ("materialize_futures", materialize_futures)):
        if not isinstance(flag, bool):
            raise RegistrationError(f"{label} must be True or False, got {flag!r}")

    def decorate(func: F) -> F:
        target = func.__func__ if isinstance(func, (staticmethod, classmethod)) else func
        if not callable(target):
            raise RegistrationError(f"@register decorates worker methods, got {func!r}")
        if hasattr(target, REGISTRATION_ATTR):
            raise RegistrationError(f"{target.__qualname__} is already decorated with @register")
        registration = Registration(
            mode, execute, blocking, materialize_futures, is_async=inspect.iscoroutinefunction(target)
        )
        setattr(target, REGISTRATION_ATTR, registration)
        return func

    return decorate


def registration_of(obj: Any) -> Registration | None:
    """The :class:`Registration` of a function, or ``None`` if undecorated."""
    target = getattr(obj, "__func__", obj)
    found = getattr(target, REGISTRATION_ATTR, None)
    return found if isinstance(found, Registration) else None


def registered_methods(worker_cls: type) -> dict[str, Registration]:
    """Every ``@register`` method of ``worker_cls`` (inherited ones included)."""
    found: dict[str, Registration] = {}
    for name in dir(worker_cls):
        if name.startswith("__"):
            continue
        try:
            attr = inspect.getattr_static(worker_cls, name)
        except AttributeError:
            continue
        registration = registration_of(attr)
        if registration is not None:
            found[name] = registration
    return found
