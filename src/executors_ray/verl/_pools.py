"""verl's ``ResourcePoolManager``: verl's bookkeeping of named :class:`~executors_ray.RayResourcePool` s."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dispatchcore import DispatchKeyError

from .._pool import PlacementError, RayResourcePool
from .._runtime import ensure_ray


class ResourcePoolShortageError(PlacementError, ValueError):
    """The cluster has fewer GPUs than a :class:`ResourcePoolManager`'s pools ask for."""


@dataclass
class ResourcePoolManager:
    """Pools by name (processes per node) and each role's pool name (verl 0.9.1's class, fields and methods)."""

    resource_pool_spec: dict[str, list[int]]
    mapping: dict[Any, str]
    max_colocate_count: int = 3
    resource_pool_dict: dict[str, RayResourcePool] = field(default_factory=dict)

    def create_resource_pool(self) -> None:
        """Make the pools (placed lazily, when the first group uses one) and check the GPUs exist."""
        for name, process_on_nodes in self.resource_pool_spec.items():
            self.resource_pool_dict[name] = RayResourcePool(
                process_on_nodes=process_on_nodes,
                use_gpu=True,
                max_colocate_count=self.max_colocate_count,
                name_prefix=name,
            )
        self._check_resource_available()

    def get_resource_pool(self, role: Any) -> RayResourcePool:
        """The pool ``role`` is mapped to."""
        try:
            return self.resource_pool_dict[self.mapping[role]]
        except KeyError:
            if role not in self.mapping:
                raise DispatchKeyError(f"role {role!r} is not in mapping (roles: {list(self.mapping)})") from None
            raise DispatchKeyError(
                f"pool {self.mapping[role]!r} of role {role!r} does not exist; call create_resource_pool() first"
            ) from None

    def get_n_gpus(self) -> int:
        """GPUs all pools ask for together (one per process)."""
        return sum(n for nodes in self.resource_pool_spec.values() for n in nodes)

    def _check_resource_available(self) -> None:
        """Refuse, naming the numbers, a spec that needs more GPUs than the cluster has."""
        ray = ensure_ray({})
        have = float(ray.cluster_resources().get("GPU", 0)) or float(ray.cluster_resources().get("NPU", 0))
        need = self.get_n_gpus()
        if have < need:
            raise ResourcePoolShortageError(
                f"resource_pool_spec {self.resource_pool_spec} needs {need} GPU(s); the Ray cluster has {have:g}. "
                "Add GPUs, shrink the spec, or (CPU tests) start Ray with ray.init(num_gpus=N) for logical GPUs"
            )
