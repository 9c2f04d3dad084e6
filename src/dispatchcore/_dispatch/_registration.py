"""What ``@register`` records on a worker method, and reading it back (apart from the decorator's typing)."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

from ._enum import Execute

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
    #: A setup call: replayed, in order, on a rank that replaces a dead one.
    setup: bool = False
    #: Safe to run again: retried once after a rank is replaced.
    retry: bool = False
    #: Keep a DataProto result on the ranks (a ``LazyDataProto``); ``None``: the group decides.
    lazy: bool | None = None


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
