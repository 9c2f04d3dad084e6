"""Every method name a call on a worker class's ranks may carry (``GroupSpec.methods``).

Executors that bind one entry point per method (Ray's dedicated actor
methods) read this list; it needs only the registrations, so the group
layer reads it without importing the worker classes' machinery.
"""

from __future__ import annotations

from .._dispatch import registered_methods

#: The core's query of a rank's mesh declarations (``Worker._dispatchcore_mesh_info``).
MESH_INFO_METHOD = "_dispatchcore_mesh_info"


def method_names(worker_cls: type) -> tuple[str, ...]:
    """Every method a call on ``worker_cls``'s ranks may name, sorted.

    The ``@register`` methods (a colocated class's role-prefixed ones among
    them, and those of each role class under its prefix), plus the core's
    mesh query.  Executors that bind entry points per method read it from
    :attr:`GroupSpec.methods`.
    """
    names = set(registered_methods(worker_cls)) | {
        MESH_INFO_METHOD,
    }
    roles: dict[str, type] = getattr(worker_cls, "_dispatchcore_roles", None) or {}
    for role, cls in roles.items():
        names.update(f"{role}_{name}" for name in registered_methods(cls))
        names.add(f"{role}_{MESH_INFO_METHOD}")
    return tuple(sorted(names))
