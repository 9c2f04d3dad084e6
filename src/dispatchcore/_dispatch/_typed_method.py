"""What type checkers see of a ``@register`` method: its driver call's signature (docs/dispatch-modes.md).

Each mode carries, as type arguments, the decorator types ``register`` returns for it; nothing here runs.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, Concatenate, Generic, ParamSpec, Protocol, TypeVar, overload

if TYPE_CHECKING:
    from ._futures import CallFuture

S = TypeVar("S")
S_contra = TypeVar("S_contra", contravariant=True)
P = ParamSpec("P")
R = TypeVar("R")
T_co = TypeVar("T_co", covariant=True)
D_co = TypeVar("D_co", covariant=True)
M_co = TypeVar("M_co", covariant=True)
B_co = TypeVar("B_co", covariant=True)
L_co = TypeVar("L_co", covariant=True)


class BoundMethod(Protocol[P, D_co]):
    """A registered method bound on a group, as type checkers see it (``MethodProxy`` at run time)."""

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> D_co: ...
    @overload
    def options(
        self,
        *,
        timeout: float | None = ...,
        lazy: bool | None = ...,
        on_timeout: str | None = ...,
        blocking: None = ...,
    ) -> BoundMethod[P, D_co]: ...
    @overload
    def options(
        self, *, timeout: float | None = ..., lazy: bool | None = ..., on_timeout: str | None = ..., blocking: bool
    ) -> BoundMethod[P, Any]: ...


class RegisteredMethod(Protocol[S_contra, P, T_co, M_co]):
    """A ``@register`` method to a type checker: a ``Callable[P, T_co]`` on a worker, ``M_co`` through a group."""

    @overload
    def __get__(self, instance: None, owner: type[Any], /) -> M_co: ...
    @overload
    def __get__(self, instance: S_contra, owner: type[Any], /) -> Callable[P, T_co]: ...


# -- what register(...) returns, per kind of mode: each __call__ maps the worker method to its RegisteredMethod
class CollectsAs(Protocol[D_co]):
    """Decorator for a mode whose result does not depend on the method's return type."""

    def __call__(self, func: Callable[Concatenate[S, P], R], /) -> RegisteredMethod[S, P, R, BoundMethod[P, D_co]]: ...


class CollectsList(Protocol):
    """Decorator for the modes that return one result per rank."""

    @overload
    def __call__(
        self, func: Callable[Concatenate[S, P], Coroutine[Any, Any, R]], /
    ) -> RegisteredMethod[S, P, Coroutine[Any, Any, R], BoundMethod[P, list[R]]]: ...
    @overload
    def __call__(
        self, func: Callable[Concatenate[S, P], R], /
    ) -> RegisteredMethod[S, P, R, BoundMethod[P, list[R]]]: ...


class CollectsListLater(Protocol):
    """:class:`CollectsList` with ``blocking=False``."""

    @overload
    def __call__(
        self, func: Callable[Concatenate[S, P], Coroutine[Any, Any, R]], /
    ) -> RegisteredMethod[S, P, Coroutine[Any, Any, R], BoundMethod[P, CallFuture[list[R]]]]: ...
    @overload
    def __call__(
        self, func: Callable[Concatenate[S, P], R], /
    ) -> RegisteredMethod[S, P, R, BoundMethod[P, CallFuture[list[R]]]]: ...


class ScattersList(Protocol):
    """Decorator for ``DP_COMPUTE``: per-rank lists, which a ``ParamSpec`` cannot say, so arguments go unchecked."""

    @overload
    def __call__(
        self, func: Callable[Concatenate[S, P], Coroutine[Any, Any, R]], /
    ) -> RegisteredMethod[S, P, Coroutine[Any, Any, R], BoundMethod[..., list[R]]]: ...
    @overload
    def __call__(
        self, func: Callable[Concatenate[S, P], R], /
    ) -> RegisteredMethod[S, P, R, BoundMethod[..., list[R]]]: ...


class ScattersListLater(Protocol):
    """:class:`ScattersList` with ``blocking=False``."""

    @overload
    def __call__(
        self, func: Callable[Concatenate[S, P], Coroutine[Any, Any, R]], /
    ) -> RegisteredMethod[S, P, Coroutine[Any, Any, R], BoundMethod[..., CallFuture[list[R]]]]: ...
    @overload
    def __call__(
        self, func: Callable[Concatenate[S, P], R], /
    ) -> RegisteredMethod[S, P, R, BoundMethod[..., CallFuture[list[R]]]]: ...


class CollectsRankZero(Protocol):
    """Decorator for calls whose result is rank 0's value, unwrapped."""

    @overload
    def __call__(
        self, func: Callable[Concatenate[S, P], Coroutine[Any, Any, R]], /
    ) -> RegisteredMethod[S, P, Coroutine[Any, Any, R], BoundMethod[P, R]]: ...
    @overload
    def __call__(self, func: Callable[Concatenate[S, P], R], /) -> RegisteredMethod[S, P, R, BoundMethod[P, R]]: ...


class CollectsRankZeroLater(Protocol):
    """:class:`CollectsRankZero` with ``blocking=False``."""

    @overload
    def __call__(
        self, func: Callable[Concatenate[S, P], Coroutine[Any, Any, R]], /
    ) -> RegisteredMethod[S, P, Coroutine[Any, Any, R], BoundMethod[P, CallFuture[R]]]: ...
    @overload
    def __call__(
        self, func: Callable[Concatenate[S, P], R], /
    ) -> RegisteredMethod[S, P, R, BoundMethod[P, CallFuture[R]]]: ...


class ModeTypes(Generic[B_co, L_co]):
    """Type arguments a mode carries: the decorator ``register`` returns blocking (B) and not (L)."""
