"""What type checkers see of a ``@register`` method: its driver call's signature.

At run time ``@register`` returns the worker function unchanged.  To a type
checker it returns a :class:`RegisteredMethod`: a descriptor that reads as
the plain method on a worker instance (``self.update_actor(batch)`` inside
the worker) and as a :class:`BoundMethod` (a :class:`~dispatchcore.MethodProxy` at run time) when read off the
class, which is what ``wg.call`` is typed as (``WorkerGroup.call`` returns
``type[W]``).  The proxy keeps the method's parameters (a ``ParamSpec``, as
Monarch's endpoints do) and returns what the dispatch mode collects:

* ``list[R]`` for ``ONE_TO_ALL``, ``ALL_TO_ALL`` (the default),
  ``DP_COMPUTE`` and ``DP_COMPUTE_METRIC``;
* ``R`` for ``Dispatch.RANK_ZERO`` and ``Execute.RANK_ZERO``;
* ``DataProto`` for the DP-proto modes and nd meshes;
* for a mode from :func:`~dispatchcore.register_dispatch_mode`, what its
  collect function is annotated to return (else ``Any``);
* a :class:`~dispatchcore.CallFuture` of that with ``blocking=False``
  (a :class:`~dispatchcore.DataProtoFuture` for the DP-proto modes).

``R`` is the worker method's return type (awaited, for ``async def``).  Each
mode carries, as type arguments, the decorator type ``register`` returns for
it when blocking and when not (:class:`TypedDispatch`); the members of
``Dispatch`` and ``Execute`` are declared with those types for checkers only.
Nothing here exists at run time beyond the names.
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
    """A registered method bound on a group, as type checkers see it: called with the method's parameters.

    :class:`~dispatchcore.MethodProxy` is the class that implements it at run
    time; this protocol lets the decorator layer name the driver's call
    without importing the group layer above it.
    """

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
    """A ``@register`` method to a type checker: a ``Callable[P, T_co]`` on a worker, ``M_co`` through a group.

    ``S_contra`` is the worker class, ``P`` the parameters after ``self``, ``M_co``
    the driver's :class:`~dispatchcore.MethodProxy` (``wg.call.<name>``).
    """

    @overload
    def __get__(self, instance: None, owner: type[Any], /) -> M_co: ...
    @overload
    def __get__(self, instance: S_contra, owner: type[Any], /) -> Callable[P, T_co]: ...


# -- what register(...) returns, per kind of mode ---------------------------------
# Each protocol is the decorator's type; its __call__ maps the worker method
# (Callable[Concatenate[S, P], R]) to a RegisteredMethod with its driver proxy.
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
    """Decorator for ``DP_COMPUTE``: the driver passes a per-rank list for each parameter.

    A ``ParamSpec`` cannot say "each parameter as a list", so the driver's
    arguments are unchecked; the result is still ``list[R]``.
    """

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
