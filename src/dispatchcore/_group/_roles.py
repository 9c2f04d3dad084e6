"""Typed role groups: one role of a colocated group as a ``WorkerGroup[Role]`` that type checkers follow.

``spawn()`` returns ``{role: WorkerGroup}`` views typed ``WorkerGroup[Any]``
(the role classes are values in a dict, out of a checker's reach), so wrong
calls on roles went unreported.  ``wg.role("actor", Actor)`` names the class
it expects: a checker reads ``WorkerGroup[Actor]`` off the argument, and at
run time the class is checked against the one the colocated class hosts for
that role, so the annotation cannot lie.  The view is ``spawn``'s (same
ranks, ``"<role>_<method>"`` names on the ranks), adapters' ``spawn``
included.
"""

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
