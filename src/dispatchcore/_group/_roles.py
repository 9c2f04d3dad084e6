"""Typed role groups: ``wg.role("actor", Actor)`` is ``spawn``'s view, typed (and checked) ``WorkerGroup[Actor]``."""

from __future__ import annotations

from typing import Any

from .._base import DispatchError


def role_view(group: Any, role: str, role_cls: type) -> Any:
    """``group.spawn([role])[role]``, once ``role_cls`` is checked to be (a base of) the class hosting ``role``."""
    if not isinstance(role_cls, type):
        raise DispatchError(f"wg.role({role!r}, cls) needs the role's worker class as cls, got {role_cls!r}")
    view = group.spawn([role])[role]
    hosted: type = view.worker_cls
    if not issubclass(hosted, role_cls):
        raise DispatchError(
            f"role {role!r} of {group.worker_cls.__name__} hosts {hosted.__qualname__}, not "
            f"{role_cls.__qualname__}: pass wg.role({role!r}, {hosted.__name__}) (or a base class of it)"
        )
    return view
