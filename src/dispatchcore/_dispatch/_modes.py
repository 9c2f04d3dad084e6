"""Dispatch modes (an enum that grows at run time) and the table, read at call time, of their functions."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, NoReturn, TypeVar

from .._base import RegistrationError
from ._enum import _DynamicEnum
from ._spec import CollectFn, DispatchFn, DispatchSpec

if TYPE_CHECKING:
    from .._data import DataProto
    from ._futures import CallFuture
    from ._proto_future import DataProtoFuture
    from ._typed_method import (
        CollectsAs,
        CollectsList,
        CollectsListLater,
        CollectsRankZero,
        CollectsRankZeroLater,
        ModeTypes,
        ScattersList,
        ScattersListLater,
    )

T = TypeVar("T")
B_co = TypeVar("B_co", covariant=True)
L_co = TypeVar("L_co", covariant=True)


class Dispatch(_DynamicEnum):
    """How a call's arguments are split over ranks and results gathered."""

    if TYPE_CHECKING:  # what each mode's driver call returns (see ``_typed_method``)
        RANK_ZERO: ClassVar[TypedDispatch[CollectsRankZero, CollectsRankZeroLater]]
        ONE_TO_ALL: ClassVar[TypedDispatch[CollectsList, CollectsListLater]]
        ALL_TO_ALL: ClassVar[TypedDispatch[CollectsList, CollectsListLater]]
        DP_COMPUTE: ClassVar[TypedDispatch[ScattersList, ScattersListLater]]
        DP_COMPUTE_PROTO: ClassVar[TypedDispatch[CollectsAs[DataProto], CollectsAs[DataProtoFuture]]]
        DP_COMPUTE_PROTO_WITH_FUNC: ClassVar[TypedDispatch[CollectsAs[DataProto], CollectsAs[DataProtoFuture]]]
        DP_COMPUTE_METRIC: ClassVar[TypedDispatch[CollectsList, CollectsListLater]]
        DIRECT_ROLLOUT_METHOD: ClassVar[TypedDispatch[CollectsAs[NoReturn], CollectsAs[NoReturn]]]


BUILTIN_DISPATCH = (
    "RANK_ZERO",
    "ONE_TO_ALL",
    "ALL_TO_ALL",
    "DP_COMPUTE",
    "DP_COMPUTE_PROTO",
    "DP_COMPUTE_PROTO_WITH_FUNC",
    "DP_COMPUTE_METRIC",
    "DIRECT_ROLLOUT_METHOD",
)
for _name in BUILTIN_DISPATCH:
    Dispatch._add(_name)


_table: dict[str, DispatchSpec] = {}
_lock = threading.Lock()


def _check_fns(what: str, dispatch_fn: Any, collect_fn: Any) -> None:
    for label, fn in (("dispatch_fn", dispatch_fn), ("collect_fn", collect_fn)):
        if not callable(fn):
            raise RegistrationError(f"{what}: {label} must be callable, got {fn!r}")


def set_builtin(mode: Dispatch, spec: DispatchSpec) -> None:
    """Install a built-in mode's functions (called once at import)."""
    _table[mode.name] = spec


def register_dispatch_mode(
    name: str, dispatch_fn: DispatchFn, collect_fn: Callable[[Any, list[Any]], T]
) -> TypedDispatch[CollectsAs[T], CollectsAs[CallFuture[T]]]:
    """Add ``Dispatch.<name>`` with its functions; a duplicate name is refused.

    ``dispatch_fn(wg, *args, **kwargs)`` returns ``(args, kwargs)`` of per-rank
    lists; ``collect_fn(wg, outputs)`` makes the caller's result.  Keep the
    returned member: type checkers read the result type off it.
    """
    _check_fns(f"register_dispatch_mode({name!r})", dispatch_fn, collect_fn)
    with _lock:
        if name in Dispatch:
            raise RegistrationError(
                f"dispatch mode {name!r} already exists; use update_dispatch_mode to replace "
                "its functions or unregister_dispatch_mode to remove it"
            )
        mode: TypedDispatch[CollectsAs[T], CollectsAs[CallFuture[T]]] = Dispatch._add(name)
        _table[name] = DispatchSpec(dispatch_fn, collect_fn, name=name)
    return mode


def update_dispatch_mode(mode: Dispatch | str, dispatch_fn: DispatchFn, collect_fn: CollectFn) -> None:
    """Replace the functions of an existing mode (takes effect on the next call)."""
    name = mode if isinstance(mode, str) else getattr(mode, "name", None)
    _check_fns(f"update_dispatch_mode({name!r})", dispatch_fn, collect_fn)
    with _lock:
        if name not in _table:
            raise RegistrationError(f"no dispatch mode {mode!r} to update; known: {sorted(_table)}")
        old = _table[name]
        _table[name] = DispatchSpec(
            dispatch_fn, collect_fn, old.returns_dataproto, old.rank_zero_only, old.direct, name
        )


def unregister_dispatch_mode(name: str) -> None:
    """Remove a mode added with :func:`register_dispatch_mode` (built-ins stay)."""
    if name in BUILTIN_DISPATCH:
        raise RegistrationError(f"built-in dispatch mode {name!r} cannot be removed")
    with _lock:
        if name not in _table:
            raise RegistrationError(f"no dispatch mode {name!r} to unregister")
        del _table[name]
        Dispatch._members.pop(name, None)


def validate_mode(mode: Any) -> None:
    """Fail at decoration time for anything that is not a usable mode."""
    if isinstance(mode, Dispatch):
        if mode.name not in _table:
            raise RegistrationError(f"dispatch mode {mode!r} was unregistered")
        return
    if isinstance(mode, DispatchSpec):
        return
    if isinstance(mode, dict):
        missing = {"dispatch_fn", "collect_fn"} - set(mode)
        if missing:
            raise RegistrationError(
                f"a dict dispatch_mode needs keys 'dispatch_fn' and 'collect_fn'; missing {sorted(missing)}"
            )
        _check_fns("dispatch_mode dict", mode["dispatch_fn"], mode["collect_fn"])
        return
    raise RegistrationError(
        f"dispatch_mode must be a Dispatch member (e.g. Dispatch.DP_COMPUTE_PROTO), a dict with "
        f"'dispatch_fn' and 'collect_fn', or make_nd_compute_dataproto_dispatch_fn(...); got {mode!r}"
    )


def resolve_mode(mode: Any) -> DispatchSpec:
    """The current functions of ``mode`` (looked up at call time)."""
    if isinstance(mode, DispatchSpec):
        return mode
    if isinstance(mode, dict):
        return DispatchSpec(mode["dispatch_fn"], mode["collect_fn"], name="dict")
    try:
        return _table[mode.name]
    except KeyError:
        raise RegistrationError(f"dispatch mode {mode!r} is no longer registered") from None


if TYPE_CHECKING:  # a ``Dispatch`` member and a ``DispatchSpec`` with their decorator types (``_typed_method``)

    class TypedDispatch(Dispatch, ModeTypes[B_co, L_co]): ...

    class TypedSpec(DispatchSpec, ModeTypes[B_co, L_co]): ...
