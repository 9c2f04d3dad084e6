"""Detached groups (``detached=True``): actors that outlive the driver that made them; any driver attaches."""

from __future__ import annotations

from typing import Any

from dispatchcore import DispatchError, WorkerGroup

from ._runtime import DETACHED_NAMESPACE, ensure_ray
from ._tags import CONTROL_GROUP


def _actor(name: str, rank: int, namespace: str | None) -> Any:
    ray = ensure_ray({})
    try:
        return ray.get_actor(f"{name}-rank{rank}", namespace=namespace or DETACHED_NAMESPACE)
    except ValueError:
        return None


def detached_world_size(name: str, namespace: str | None = None, timeout: float = 60.0) -> int:
    """World size of the running detached group ``name``, asked of its rank 0."""
    ray = ensure_ray({})
    actor = _actor(name, 0, namespace)
    if actor is None:
        raise DispatchError(
            f"no detached ray group named {name!r} in namespace {namespace or DETACHED_NAMESPACE!r}; create it "
            f"with WorkerGroup(..., backend='ray', detached=True, name={name!r})"
        )
    ref = actor.identity.options(concurrency_group=CONTROL_GROUP).remote()
    ready, _ = ray.wait([ref], timeout=timeout)
    if not ready:
        raise DispatchError(f"detached group {name!r}: rank 0 did not answer within {timeout:g} s")
    return int(ray.get(ready[0])["world_size"])


def attach_detached(
    name: str, worker_cls: type, world_size: int | None = None, *, namespace: str | None = None, **options: Any
) -> WorkerGroup[Any]:
    """A :class:`WorkerGroup` on the running detached group ``name`` (another driver's)."""
    if world_size is None:
        world_size = detached_world_size(name, namespace)
    if namespace is not None:
        options["namespace"] = namespace
    return WorkerGroup(worker_cls, world_size, backend="ray", name=name, attach=True, **options)


def kill_detached(name: str, namespace: str | None = None) -> int:
    """Kill every actor of the detached group ``name``; returns how many were found."""
    ray = ensure_ray({})
    killed = 0
    while (actor := _actor(name, killed, namespace)) is not None:
        ray.kill(actor, no_restart=True)
        killed += 1
    return killed
