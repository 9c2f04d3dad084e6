"""Stage 1b of a call: bind each rank's arguments (after dispatch) against the worker method's signature.

A call that cannot fit raises ``CallSignatureError`` before anything is sent; shapes that bound are remembered.
"""

from __future__ import annotations

import difflib
import inspect
import re
from typing import Any

from .._base import CallSignatureError

#: Shapes remembered per method (a method called with ever new keyword sets stops caching).
_MAX_SHAPES = 64
#: Where the core's colocated classes define their ``<role>_<method>`` forwarders.
_FORWARDER_MODULES = ("dispatchcore._worker._colocate", "dispatchcore._worker._fused")
_MISSING: Any = object()
_QUOTED = re.compile(r"'([^']+)'")


class CallBinder:
    """One worker method's signature, and the argument shapes known to fit it."""

    __slots__ = ("_called", "_fits", "_owner", "_self_args", "_signature")

    def __init__(self, called: str, owner: str, signature: inspect.Signature, bound_self: bool) -> None:
        self._called = called  # the method's name on the ranks (``actor_update`` for a role's)
        self._owner = owner  # where its signature was read (``Actor.update``)
        self._signature = signature
        #: 1 when the method receives the worker (or class) first: a placeholder stands in for it.
        self._self_args = int(bound_self)
        #: Shapes that bound: the positional count, or ``(count, *keywords)`` when there are keywords.
        self._fits: set[int | tuple[Any, ...]] = set()

    def check(self, n_args: int, keywords: dict[str, Any], mode_name: str) -> None:
        """Raise :class:`CallSignatureError` unless ``n_args`` positionals and ``keywords``' names bind."""
        shape = (n_args, *keywords) if keywords else n_args
        if shape in self._fits:
            return
        try:
            self._signature.bind(*[None] * (n_args + self._self_args), **dict.fromkeys(keywords))
        except TypeError as exc:
            raise self._error(str(exc), n_args, tuple(keywords), mode_name) from None
        if len(self._fits) < _MAX_SHAPES:
            self._fits.add(shape)

    def _error(self, reason: str, n_args: int, keywords: tuple[str, ...], mode_name: str) -> CallSignatureError:
        found = _QUOTED.search(reason)
        parameter = found.group(1) if found else None
        if parameter is not None and "unexpected keyword" in reason:
            names = [p.name for p in self._signature.parameters.values() if p.kind is not p.VAR_KEYWORD]
            close = difflib.get_close_matches(parameter, names, n=1)
            if close:
                reason += f" (did you mean {close[0]!r}?)"
        sent = f"{n_args} positional argument{'s' * (n_args != 1)}"
        if keywords:
            sent += f" and keyword{'s' * (len(keywords) != 1)} {', '.join(map(repr, keywords))}"
        # The signature as the driver calls it: without ``self``, without annotations (often strings).
        params = list(self._signature.parameters.values())
        shown = inspect.Signature(
            [p.replace(annotation=p.empty) for p in params[_self_param(params, bool(self._self_args)) :]]
        )
        error = CallSignatureError(
            f"call {self._called!r} does not fit {self._owner}{shown}: {reason}; after "
            f"dispatch mode {mode_name} each rank would receive {sent}. Nothing was sent to the ranks"
        )
        error.method = self._owner
        error.parameter = parameter
        return error


def bind_call(
    site: Any,  # the call's CallSite (typed loosely: the pipeline's import depth)
    group: Any,
    name: str,
    per_rank_args: tuple[Any, ...],
    per_rank_kwargs: dict[str, Any],
    mode: str,
) -> None:
    """Check the dispatched call of ``name`` against its worker method; the signature is read on first use."""
    binders = site.shared.binders
    key = site.prefix + name
    binder = binders.get(key, _MISSING)
    if binder is _MISSING:
        binder = binders[key] = binder_for(group.worker_cls, name, key)
    if binder is not None:
        binder.check(len(per_rank_args), per_rank_kwargs, mode)
    elif "self" in per_rank_kwargs:  # a method taking ``*args, **kwargs`` is not read, but never takes this one
        raise CallSignatureError(
            f"call {key!r} got the keyword 'self': each rank passes its worker as self; pass the value under "
            "another name"
        )


def binder_for(worker_cls: type, name: str, called: str | None = None) -> CallBinder | None:
    """A :class:`CallBinder` for ``worker_cls.name`` (``called`` on the ranks), or ``None`` when not checked."""
    try:
        attr = inspect.getattr_static(worker_cls, name)
    except AttributeError:
        return None  # not on the class (built in ``__init__``, ``__getattr__``): the rank decides
    role_target = _role_method(worker_cls, name, attr)
    if role_target is not None:
        return binder_for(*role_target, called or name)
    if isinstance(attr, staticmethod):
        func, bound_self = attr.__func__, False
    elif isinstance(attr, classmethod):
        func, bound_self = attr.__func__, True
    elif inspect.isfunction(attr):
        func, bound_self = attr, True
    else:
        return None  # a callable object, a partialmethod...: not read
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError):
        return None
    if _binds_anything(signature, bound_self):
        return None
    return CallBinder(called or name, f"{worker_cls.__name__}.{name}", signature, bound_self)


def _role_method(worker_cls: type, name: str, attr: Any) -> tuple[type, str] | None:
    """``(role class, method)`` when ``name`` is a colocated class's ``<role>_<method>`` forwarder."""
    roles: dict[str, type] | None = getattr(worker_cls, "_dispatchcore_roles", None)
    if not roles or getattr(attr, "__module__", None) not in _FORWARDER_MODULES:
        return None
    for role, role_cls in roles.items():
        method = name[len(role) + 1 :]
        if name.startswith(f"{role}_") and hasattr(role_cls, method):
            return role_cls, method
    return None


def _binds_anything(signature: inspect.Signature, bound_self: bool) -> bool:
    """``(self, *args, **kwargs)``, give or take optional parameters: every call binds."""
    params = list(signature.parameters.values())
    params = params[_self_param(params, bound_self) :]
    kinds = {p.kind for p in params}
    if inspect.Parameter.VAR_POSITIONAL not in kinds or inspect.Parameter.VAR_KEYWORD not in kinds:
        return False
    var = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    return all(p.kind in var or p.default is not p.empty for p in params)


def _self_param(params: list[inspect.Parameter], bound_self: bool) -> int:
    """1 when the first parameter takes ``self`` (not when ``*args`` swallows it)."""
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return int(bound_self and bool(params) and params[0].kind in positional)
