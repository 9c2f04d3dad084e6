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
        registration = getattr(getattr(attr, "__func__", attr), REGISTRATION_ATTR, None)
        if isinstance(registration, Registration):
            found[name] = registration
    return found
