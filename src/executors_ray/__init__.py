"""Ray executor: one actor per rank, resource pools, detached groups, verl adapters.

Importing this package does not import ray; the first group does.
"""

from ._detached import attach_detached, detached_world_size, kill_detached
from ._executor import RayExecutor
from ._pool import PlacementError, RayResourcePool, split_resource_pool
from ._verl import RayClassWithInitArgs, RayWorkerGroup

__all__ = [
    "PlacementError",
    "RayClassWithInitArgs",
    "RayExecutor",
    "RayResourcePool",
    "RayWorkerGroup",
    "attach_detached",
    "detached_world_size",
    "kill_detached",
    "split_resource_pool",
]
