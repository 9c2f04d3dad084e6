"""Torch's default process group over exactly one worker group's ranks, for code that needs it (FSDP2, DCP).

A plain ``init_process_group()`` makes a group the library cannot abort;
this builds the default group on the executor's store instead, never from
``RANK``/``WORLD_SIZE``.  The group torch, the mesh and FSDP2 hold is a
stable outer object that forwards every collective to the link's current
communicator, which the link alone holds, aborts and rebuilds (see
``docs/process-groups.md``).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

from .._base import DispatchError
from ._collective import DEFAULT_TIMEOUT_S, LIBRARY_DEFAULT, CollectiveLink, made_default_group
from ._collective_ops import current_rank

#: The name the forwarding group is registered under with ``torch.distributed.Backend``.
BACKEND_NAME = "dispatchcore"
#: The collectives ``torch.distributed`` calls on a group, forwarded by name to the current communicator.
FORWARDED = (
    "allreduce allreduce_coalesced allgather allgather_coalesced all_gather_single all_gather_single_coalesced "
    "broadcast barrier gather scatter reduce reduce_scatter reduce_scatter_single reduce_scatter_single_coalesced "
    "alltoall all_to_all_single send recv recv_anysource"
).split()
#: The link the group being initialised forwards to: torch calls the backend's creator with its own arguments only.
_pending: list[tuple[CollectiveLink, float]] = []


#: The meshes ``init_process_group`` made in this process, by (shape, dimension names).
_meshes: dict[tuple[tuple[int, ...], tuple[str, ...] | None], Any] = {}


def init_process_group(
    *,
    timeout: float = DEFAULT_TIMEOUT_S,
    mesh_shape: tuple[int, ...] | None = None,
    mesh_dim_names: tuple[str, ...] | None = None,
) -> Any:
    """Make torch's default process group over the calling worker group's ranks; a ``DeviceMesh`` over it.

    Call it in a worker's ``__init__`` or a method (every rank at once); pass
    the mesh to ``fully_shard(model, mesh=...)``.  The mesh is 1-D unless
    ``mesh_shape`` says otherwise (``(2, 2)`` for HSDP over 4 ranks, with
    ``mesh_dim_names=("replicate", "shard")``).  gloo on CPU, and NCCL for
    CUDA tensors where the ranks have GPUs (set each rank's device first).
    It is built on the executor's store, never from ``RANK``/``WORLD_SIZE``,
    so it works under the torchrun launcher with ``ranks=[...]``.  Calling it
    again (colocated roles) returns the same mesh for the same shape.  Refused
    where this process already holds a default group (yours, or one for
    another group), and on ``local`` (its ranks are threads of one process).

    Unlike your own ``torch.distributed.init_process_group()``, the library
    can abort this group and every sub-group made on it (``init_device_mesh``,
    ``DeviceMesh(...)``, ``new_group`` without a ``backend=``): when a call
    ends early, ranks blocked in one of their collectives (an FSDP2
    all-gather) raise at once, and the next collective runs on a new
    communicator behind the same groups and mesh.  ``timeout`` bounds each
    of their collectives.
    """
    link, rank, world_size = current_rank()
    shape, names = _checked_mesh(world_size, mesh_shape, mesh_dim_names)
    if link.shares_process:
        raise DispatchError(
            f"dispatchcore.collective.init_process_group: the {link.backend!r} backend's ranks are threads of one "
            "process, and a process holds one torch default process group; on one machine use "
            "WorkerGroup(..., backend='torchrun'), which starts a process per rank itself"
        )
    import torch.distributed as dist

    if dist.is_initialized():
        if not (made_default_group() and LIBRARY_DEFAULT[0][0] is link):
            maker = "for another group" if made_default_group() else "by the user"
            raise DispatchError(
                "dispatchcore.collective.init_process_group: this process already holds torch's default process "
                f"group ({dist.get_world_size()} ranks, made {maker}); a process has one, so only one worker group "
                "per process can make it"
            )
    else:
        _init_default(link, rank, world_size, timeout)
    mesh = _meshes.get((shape, names))
    if mesh is None:
        mesh = _meshes[(shape, names)] = _mesh(shape, names)
    return mesh


def _checked_mesh(
    world_size: int, shape: tuple[int, ...] | None, names: tuple[str, ...] | None
) -> tuple[tuple[int, ...], tuple[str, ...] | None]:
    """``(shape, names)`` as the mesh takes them; a bad shape or name list raises naming the fix."""
    where = "dispatchcore.collective.init_process_group"
    shape = (world_size,) if shape is None else tuple(shape)
    if not shape or not all(isinstance(size, int) and size > 0 for size in shape):
        raise DispatchError(f"{where}: mesh_shape must be positive ints, like (2, 2); got {shape!r}")
    product = 1
    for size in shape:
        product *= size
    if product != world_size:
        raise DispatchError(
            f"{where}: mesh_shape {shape} holds {product} ranks, but the group has {world_size}; "
            f"pass a shape whose sizes multiply to {world_size}"
        )
    if names is not None:
        names = tuple(names)
        if len(names) != len(shape) or len(set(names)) != len(names) or not all(isinstance(n, str) for n in names):
            raise DispatchError(
                f"{where}: mesh_dim_names must be {len(shape)} distinct strings, one per mesh dimension of "
                f"{shape}; got {names!r}"
            )
    return shape, names


def _init_default(link: CollectiveLink, rank: int, world_size: int, timeout: float) -> None:
    import torch.distributed as dist

    store = link.store(timeout)
    if store is None:
        raise DispatchError(
            f"dispatchcore.collective.init_process_group: the {link.backend!r} backend gives its ranks no store "
            "to build a group on; call torch.distributed.init_process_group() yourself"
        )
    if BACKEND_NAME not in dist.Backend.backend_list:
        dist.Backend.register_backend(BACKEND_NAME, _create, extended_api=True, devices=["cpu", "cuda"])
    _pending[:] = [(link, timeout)]
    try:
        dist.init_process_group(
            BACKEND_NAME,
            store=dist.PrefixStore("dispatchcore-default/", store),
            rank=rank,
            world_size=world_size,
            timeout=timedelta(seconds=timeout),
        )
    finally:
        _pending.clear()
    _meshes.clear()
    LIBRARY_DEFAULT[:] = [(link, dist.group.WORLD)]


def _mesh(shape: tuple[int, ...], names: tuple[str, ...] | None) -> Any:
    import torch
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if len(shape) == 1 and names is None:
        return DeviceMesh(device, list(range(shape[0])))
    return init_device_mesh(device, shape, mesh_dim_names=names)


def _create(options: Any, backend_options: Any = None) -> Any:
    """torch's creator for :data:`BACKEND_NAME`: a forwarding group for the default group or a sub-group of it.

    The default group (no global ranks) forwards to the link being
    initialised; a sub-group (``new_group``, a mesh dimension) to the default
    group's link, on a communicator of its own named by torch's group name,
    which every member agrees on and the link drops with the rest on an abort.
    """
    if not options.global_ranks_in_group:
        link, seconds = _pending[0]
        return _forwarding_class()(link, options.group_rank, options.group_size, seconds, "default")
    import torch.distributed as dist

    world: Any = dist.group.WORLD
    parent = getattr(world, "link", None)
    if parent is None:  # a default group not made here: never handed this backend
        raise DispatchError(f"the {BACKEND_NAME!r} backend makes sub-groups of collective.init_process_group's only")
    kind = f"sub/{options.group_id}"
    return _forwarding_class()(parent, options.group_rank, options.group_size, world.timeout, kind)


_classes: list[type] = []


def _forwarding_class() -> type:
    """The class of torch's default group made here (defined on first use: torch is imported lazily)."""
    if _classes:
        return _classes[0]
    import torch.distributed as dist

    class ForwardingGroup(dist.ProcessGroup):
        """What torch, the mesh and FSDP2 hold; every collective runs on the link's current communicator."""

        def __init__(self, link: Any, rank: int, world_size: int, timeout: float, kind: str) -> None:
            super().__init__(rank, world_size)  # type: ignore[call-arg]  # torch's stub lists (store, rank, size) only
            self.link, self.timeout, self.kind = link, timeout, kind
            self.group_name_, self.group_desc_ = "", ""

        def getBackendName(self) -> str:  # noqa: N802 - torch's names
            return BACKEND_NAME

        def getGroupName(self) -> str:  # noqa: N802
            return self.group_name_

        def setGroupName(self, name: str) -> None:  # noqa: N802
            self.group_name_ = name

        def getGroupDesc(self) -> str:  # noqa: N802
            return self.group_desc_

        def setGroupDesc(self, desc: str) -> None:  # noqa: N802
            self.group_desc_ = desc

    for name in FORWARDED:
        setattr(ForwardingGroup, name, _forward(name))
    _classes.append(ForwardingGroup)
    return ForwardingGroup


def _forward(name: str) -> Callable[..., Any]:
    def forward(group: Any, *args: Any, **kwargs: Any) -> Any:
        current = group.link.communicator(group.kind, group.rank(), group.size(), group.timeout)
        return getattr(current, name)(*args, **kwargs)

    forward.__name__ = name
    return forward
