"""The core's mesh query on a rank (``Operation.MESH``): one worker's, or one role's, declaration of a mesh.

Apart from the declarations (``_mesh``) so that ``WorkerHost`` reads it without the dispatch layer.
"""

from __future__ import annotations

from typing import Any

from .._base import DispatchAttributeError, DispatchKeyError


def declared_mesh(worker: Any, mesh_name: str) -> tuple[int, bool]:
    """``worker``'s ``(dp_rank, is_collect)`` on ``mesh_name``; a mesh it never declared raises, naming the fix."""
    declared: dict[str, tuple[int, bool]] | None = getattr(worker, "_dispatch_collect_info", None)
    if declared is None:
        raise DispatchAttributeError(
            f"{type(worker).__name__} declares no meshes: subclass dispatchcore.Worker and call "
            f"self._register_dispatch_collect_info({mesh_name!r}, dp_rank, is_collect) in it"
        )
    found = declared.get(mesh_name)
    if found is None:
        raise DispatchKeyError(
            f"rank {getattr(worker, 'rank', '?')} registered no mesh {mesh_name!r} (known: {sorted(declared)}); call "
            f"self._register_dispatch_collect_info({mesh_name!r}, dp_rank, is_collect) "
            "in the worker before using its nd dispatch mode"
        )
    return found


def mesh_info(worker: Any, prefix: str, mesh_name: str) -> tuple[int, bool]:
    """``Operation.MESH`` on a rank: the declaration of the role ``prefix`` names (``""``: the worker's own).

    A colocated or fused worker's role views prefix its methods with ``"<role>_"`` (nested: one per level);
    each level is one role object of the worker above it.
    """
    target = worker
    while prefix:
        roles = vars(target).get("_dispatchcore_role_objects") or vars(target).get("_dispatchcore_fused") or {}
        role = max((r for r in roles if prefix.startswith(f"{r}_")), key=len, default=None)
        if role is None:
            raise DispatchKeyError(
                f"{type(target).__name__} hosts no role for the prefix {prefix!r} (roles: {sorted(roles)})"
            )
        target, prefix = roles[role], prefix[len(role) + 1 :]
    return declared_mesh(target, mesh_name)
