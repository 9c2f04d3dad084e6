"""Torch's default process group over exactly one worker group's ranks, for code that needs it (FSDP2, DCP).

A plain ``init_process_group()`` reads ``RANK``/``WORLD_SIZE`` from the
environment, which under the torchrun launcher with ``ranks=[...]`` describe
the whole launch, not the group; this builds the default group on the
executor's own store instead.  See ``docs/process-groups.md``.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from .._base import DispatchError
from ._collective import DEFAULT_TIMEOUT_S, LIBRARY_DEFAULT, made_default_group
from ._collective_ops import current_rank


def init_process_group(*, timeout: float = DEFAULT_TIMEOUT_S) -> Any:
    """Make torch's default process group over the calling worker group's ranks; a 1-D ``DeviceMesh`` over it.

    Call it in a worker's ``__init__`` or a method (every rank at once); pass
    the mesh to ``fully_shard(model, mesh=...)``.  gloo on CPU, and NCCL for
    CUDA tensors where the ranks have GPUs (set each rank's device first).
    It is built on the executor's store, never from ``RANK``/``WORLD_SIZE``,
    so it works under the torchrun launcher with ``ranks=[...]``.  Calling it
    again (colocated roles) returns the same mesh; after a rank replacement
    (in ``on_membership_change``) it builds a new group and mesh.  Refused
    where this process already holds a default group for another group, and
    on ``local`` (its ranks are threads of one process).

    The library cannot abort this group (torch, the mesh and FSDP2 hold its
    communicator): a rank blocked in one of its collectives leaves at
    ``timeout`` or is restarted after ``cancel_grace``.  ``dispatchcore.collective``'s
    own functions keep running on the library's abortable group.
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

    made = LIBRARY_DEFAULT[0] if LIBRARY_DEFAULT and made_default_group() else None
    if dist.is_initialized():
        if made is not None and made[0] is link and made[1] == link.generation:
            return made[2]
        if made is None or made[0] is not link:
            raise DispatchError(
                "dispatchcore.collective.init_process_group: this process already holds torch's default process "
                f"group ({dist.get_world_size()} ranks, made {'by the user' if made is None else 'for another group'}"
                "); a process has one, so only one worker group per process can make it"
            )
        dist.destroy_process_group()  # a replacement: the old group's ranks are gone
    store = link.store(timeout)
    if store is None:
        raise DispatchError(
            f"dispatchcore.collective.init_process_group: the {link.backend!r} backend gives its ranks no store "
            "to build a group on; call torch.distributed.init_process_group() yourself"
        )
    cuda = torch.cuda.is_available()
    dist.init_process_group(
        "cpu:gloo,cuda:nccl" if cuda else "gloo",
        store=dist.PrefixStore(f"dispatchcore-default/{link.generation}/", store),
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=timeout),
    )
    mesh = DeviceMesh("cuda" if cuda else "cpu", list(range(world_size)))
    LIBRARY_DEFAULT[:] = [(link, link.generation, mesh)]
    return mesh
