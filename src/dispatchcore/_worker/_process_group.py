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


def init_process_group(*, timeout: float = DEFAULT_TIMEOUT_S) -> Any:
    """Make torch's default process group over the calling worker group's ranks; a 1-D ``DeviceMesh`` over it.

    Call it in a worker's ``__init__`` or a method (every rank at once); pass
    the mesh to ``fully_shard(model, mesh=...)``.  gloo on CPU, and NCCL for
    CUDA tensors where the ranks have GPUs (set each rank's device first).
    It is built on the executor's store, never from ``RANK``/``WORLD_SIZE``,
    so it works under the torchrun launcher with ``ranks=[...]``.  Calling it
    again (colocated roles) returns the same mesh.  Refused where this
    process already holds a default group (yours, or one for another
    group), and on ``local`` (its ranks are threads of one process).

    Unlike your own ``torch.distributed.init_process_group()``, the library
    can abort this group: when a call ends early, ranks blocked in one of its
    collectives (an FSDP2 all-gather) raise at once, and the next collective
    runs on a new communicator behind the same group and mesh.  ``timeout``
    bounds each of its collectives.
    """
    link, rank, world_size = current_rank()
    if link.shares_process:
        raise DispatchError(
            f"dispatchcore.collective.init_process_group: the {link.backend!r} backend's ranks are threads of one "
            "process, and a process holds one torch default process group; on one machine use "
            "WorkerGroup(..., backend='torchrun'), which starts a process per rank itself"
        )
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh

    if dist.is_initialized():
        if made_default_group() and LIBRARY_DEFAULT[0][0] is link:
            return LIBRARY_DEFAULT[0][1]
        maker = "for another group" if made_default_group() else "by the user"
        raise DispatchError(
            "dispatchcore.collective.init_process_group: this process already holds torch's default process "
            f"group ({dist.get_world_size()} ranks, made {maker}); a process has one, so only one worker group "
            "per process can make it"
        )
    store = link.store(timeout)
    if store is None:
        raise DispatchError(
            f"dispatchcore.collective.init_process_group: the {link.backend!r} backend gives its ranks no store "
            "to build a group on; call torch.distributed.init_process_group() yourself"
        )
    if BACKEND_NAME not in dist.Backend.backend_list:
        dist.Backend.register_backend(BACKEND_NAME, _create, devices=["cpu", "cuda"])
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
    mesh = DeviceMesh("cuda" if torch.cuda.is_available() else "cpu", list(range(world_size)))
    LIBRARY_DEFAULT[:] = [(link, mesh)]
    return mesh


def _create(store: Any, rank: int, world_size: int, timeout: timedelta) -> Any:
    """torch's creator for :data:`BACKEND_NAME`: the forwarding group for the link being initialised."""
    link, seconds = _pending[0]
    return _forwarding_class()(link, rank, world_size, seconds)


_classes: list[type] = []


def _forwarding_class() -> type:
    """The class of torch's default group made here (defined on first use: torch is imported lazily)."""
    if _classes:
        return _classes[0]
    import torch.distributed as dist

    class ForwardingGroup(dist.ProcessGroup):
        """What torch, the mesh and FSDP2 hold; every collective runs on the link's current communicator."""

        def __init__(self, link: Any, rank: int, world_size: int, timeout: float) -> None:
            super().__init__(rank, world_size)  # type: ignore[call-arg]  # torch's stub lists (store, rank, size) only
            self.link, self.timeout = link, timeout
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
        current = group.link.communicator("default", group.rank(), group.size(), group.timeout)
        return getattr(current, name)(*args, **kwargs)

    forward.__name__ = name
    return forward
