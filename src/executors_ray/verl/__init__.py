"""verl's ``single_controller.ray`` names over the Ray executor; importing it does not import ray."""

from dispatchcore import create_colocated_worker_cls

from .._pool import RayResourcePool, SubRayResourcePool, split_resource_pool
from ._group import RayClassWithInitArgs, RayWorkerGroup, create_colocated_worker_cls_fused
from ._pools import ResourcePoolManager, ResourcePoolShortageError
from ._refs import RefList

__all__ = [
    "RayClassWithInitArgs",
    "RayResourcePool",
    "RayWorkerGroup",
    "RefList",
    "ResourcePoolManager",
    "ResourcePoolShortageError",
    "SubRayResourcePool",
    "create_colocated_worker_cls",
    "create_colocated_worker_cls_fused",
    "split_resource_pool",
]
