"""verl's ``single_controller.ray`` names over the Ray executor, so a verl driver ports by changing imports.

``RayClassWithInitArgs``, ``RayWorkerGroup`` (with ``execute_all_sync`` /
``execute_all_async``, ``from_detached``, ``fuse``),
``create_colocated_worker_cls_fused``, verl's result shapes for
``blocking=False`` calls (:class:`RefList`) and verl's
``ResourcePoolManager``.  The resource pools are the Ray executor's own
placement and are re-exported here so one import line serves a verl
driver; :mod:`executors_ray` re-exports every name of this package too.

Importing this package does not import ray; the first group does.
"""

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
