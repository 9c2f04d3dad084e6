"""Ray executor: one actor per rank, resource pools, detached groups, verl's names; importing it does not import ray."""

from dispatchcore import create_colocated_worker_cls, create_colocated_worker_raw_cls

from ._detached import attach_detached, detached_world_size, kill_detached
from ._executor import RayExecutor
from ._pool import (
    NODE_ORDER_LABEL,
    PlacementError,
    PlacementTimeoutError,
    RayResourcePool,
    SubRayResourcePool,
    split_resource_pool,
)
from .verl import (
    RayClassWithInitArgs,
    RayWorkerGroup,
    RefList,
    ResourcePoolManager,
    ResourcePoolShortageError,
    create_colocated_worker_cls_fused,
)

__all__ = [
    "NODE_ORDER_LABEL",
    "PlacementError",
    "PlacementTimeoutError",
    "RayClassWithInitArgs",
    "RayExecutor",
    "RayResourcePool",
    "RayWorkerGroup",
    "RefList",
    "ResourcePoolManager",
    "ResourcePoolShortageError",
    "SubRayResourcePool",
    "attach_detached",
    "create_colocated_worker_cls",
    "create_colocated_worker_cls_fused",
    "create_colocated_worker_raw_cls",
    "detached_world_size",
    "kill_detached",
    "split_resource_pool",
]
