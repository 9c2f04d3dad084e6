"""Every method name a call on a worker class's ranks may carry (``GroupSpec.methods``).

Executors that bind one entry point per method (Ray's dedicated actor
methods) read this list; it needs only the registrations, so the group
layer reads it without importing the worker classes' machinery.
"""

from __future__ import annotations

from .._dispatch import registered_methods


def method_names(worker_cls: type) -> tuple[str, ...]:
    """Every method a call on ``worker_cls``'s ranks may name, sorted.

    The ``@register`` methods (a colocated class's role-prefixed ones among
    them, and those of each role class under its prefix).  The core's own
    work on the ranks is no method (``Instructions.operation``).  Executors
    that bind entry points per method read it from :attr:`GroupSpec.methods`.
    """
    names = set(registered_methods(worker_cls))
    roles: dict[str, type] = getattr(worker_cls, "_dispatchcore_roles", None) or {}
    for role, cls in roles.items():
        names.update(f"{role}_{name}" for name in registered_methods(cls))
    return tuple(sorted(names))
