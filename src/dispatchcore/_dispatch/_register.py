"""The ``@register`` decorator: options stored on the function, validated when applied (at import, not first call)."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, Concatenate, Literal, ParamSpec, TypedDict, TypeVar, Unpack, overload

from .._base import RegistrationError
from ._enum import Execute
from ._modes import Dispatch, validate_mode
from ._registration import REGISTRATION_ATTR, Registration

if TYPE_CHECKING:
    from ._enum import ExecuteAll, ExecuteRankZero
    from ._typed_method import (
        BoundMethod,
        CollectsAs,
        CollectsList,
        CollectsListLater,
        CollectsRankZero,
        CollectsRankZeroLater,
        ModeTypes,
        RegisteredMethod,
    )

F = TypeVar("F", bound=Callable[..., Any])
S = TypeVar("S")
P = ParamSpec("P")
R = TypeVar("R")
B = TypeVar("B")
L = TypeVar("L")


class _Flags(TypedDict, total=False):
    """The keyword flags every typed overload of ``register`` takes alike."""

    materialize_futures: bool
    setup: bool
    retry: bool
    lazy: bool | None


# The overloads only tell type checkers what a driver call returns per mode (``_typed_method``).
# Bare ``@register``: ALL_TO_ALL, one result per rank.
@overload
def register(
    dispatch_mode: Callable[Concatenate[S, P], Coroutine[Any, Any, R]], /
) -> RegisteredMethod[S, P, Coroutine[Any, Any, R], BoundMethod[P, list[R]]]: ...
@overload
def register(
    dispatch_mode: Callable[Concatenate[S, P], R], /
) -> RegisteredMethod[S, P, R, BoundMethod[P, list[R]]]: ...


# A mode that carries its result types (built-in members, nd meshes, register_dispatch_mode's).
@overload
def register(
    dispatch_mode: ModeTypes[B, L],
    execute_mode: ExecuteAll | None = ...,
    blocking: Literal[True] = ...,
    **flags: Unpack[_Flags],
) -> B: ...
@overload
def register(
    dispatch_mode: ModeTypes[B, L],
    execute_mode: ExecuteAll | None = ...,
    *,
    blocking: Literal[False],
    **flags: Unpack[_Flags],
) -> L: ...


# The default mode, ALL_TO_ALL.
@overload
def register(
    dispatch_mode: None = ...,
    execute_mode: ExecuteAll | None = ...,
    blocking: Literal[True] = ...,
    **flags: Unpack[_Flags],
) -> CollectsList: ...
@overload
def register(
    dispatch_mode: None = ...,
    execute_mode: ExecuteAll | None = ...,
    *,
    blocking: Literal[False],
    **flags: Unpack[_Flags],
) -> CollectsListLater: ...


# Execute.RANK_ZERO, whatever the mode: rank 0's value.
@overload
def register(
    dispatch_mode: Any,
    execute_mode: ExecuteRankZero,
    blocking: Literal[True] = ...,
    **flags: Unpack[_Flags],
) -> CollectsRankZero: ...
@overload
def register(
    dispatch_mode: Any = ...,
    *,
    execute_mode: ExecuteRankZero,
    blocking: Literal[True] = ...,
    **flags: Unpack[_Flags],
) -> CollectsRankZero: ...
@overload
def register(
    dispatch_mode: Any,
    execute_mode: ExecuteRankZero,
    *,
    blocking: Literal[False],
    **flags: Unpack[_Flags],
) -> CollectsRankZeroLater: ...
@overload
def register(
    dispatch_mode: Any = ...,
    *,
    execute_mode: ExecuteRankZero,
    blocking: Literal[False],
    **flags: Unpack[_Flags],
) -> CollectsRankZeroLater: ...


# Anything else (a dict mode, a member looked up at run time, a non-literal flag): Any.
@overload
def register(
    dispatch_mode: Any = ...,
    execute_mode: Any = ...,
    blocking: bool = ...,
    **flags: Unpack[_Flags],
) -> CollectsAs[Any]: ...


def register(
    dispatch_mode: Any = None,
    execute_mode: Any = None,
    blocking: bool = True,
    materialize_futures: bool = True,
    setup: bool = False,
    retry: bool = False,
    lazy: bool | None = None,
) -> Any:
    """Mark a worker method as callable through a ``WorkerGroup`` (bare ``@register`` or with options).

    ``dispatch_mode`` (default ``ALL_TO_ALL``) splits arguments and gathers
    results; ``execute_mode`` says which ranks run it; ``blocking=False``
    returns a future; ``setup=True`` replays it on a replacement rank;
    ``retry=True`` retries it once after one; ``lazy=True`` keeps a DataProto
    result on the ranks (``None``: the group decides).
    """
    if inspect.isfunction(dispatch_mode) and execute_mode is None:
        return register()(dispatch_mode)
    mode = Dispatch.ALL_TO_ALL if dispatch_mode is None else dispatch_mode
    execute = Execute.ALL if execute_mode is None else execute_mode
    validate_mode(mode)
    if not isinstance(execute, Execute):
        raise RegistrationError(f"execute_mode must be Execute.ALL or Execute.RANK_ZERO, got {execute!r}")
    flags = (("blocking", blocking), ("materialize_futures", materialize_futures), ("setup", setup), ("retry", retry))
    for label, flag in flags:
        if not isinstance(flag, bool):
            raise RegistrationError(f"{label} must be True or False, got {flag!r}")
    if lazy is not None and not isinstance(lazy, bool):
        raise RegistrationError(f"lazy must be True, False or None (the group decides), got {lazy!r}")

    def decorate(func: F) -> F:
        target = func.__func__ if isinstance(func, (staticmethod, classmethod)) else func
        if not callable(target):
            raise RegistrationError(f"@register decorates worker methods, got {func!r}")
        if hasattr(target, REGISTRATION_ATTR):
            raise RegistrationError(f"{target.__qualname__} is already decorated with @register")
        registration = Registration(
            mode,
            execute,
            blocking,
            materialize_futures,
            is_async=inspect.iscoroutinefunction(target),
            setup=setup,
            retry=retry,
            lazy=lazy,
        )
        setattr(target, REGISTRATION_ATTR, registration)
        return func

    return decorate
