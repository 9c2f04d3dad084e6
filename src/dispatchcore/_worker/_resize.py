"""A group that grew or shrank, rank side: what changed, and each rank's new number (``docs/elastic-groups.md``).

The driver half (waiting for calls, starting and stopping ranks, views) is
:mod:`dispatchcore._group._resize`; every rank then runs ``Operation.RESIZE``:
it takes its new rank and world size, and rejoins as after a replacement
(collectives on a new generation, setup replayed on new ranks, the hook).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ._collective import LIBRARY_DEFAULT, CollectiveLink
from ._rejoin import MembershipChange


@dataclass(frozen=True)
class GroupResized(MembershipChange):
    """What every rank learns after ``WorkerGroup.grow`` / ``shrink``; ``replaced`` holds the added ranks."""

    #: The world size before the resize.
    previous_world_size: int = 0
    #: Ranks added by a grow (new numbers; the same as ``replaced``).
    added: tuple[int, ...] = ()
    #: Ranks a shrink removed, numbered as before it (the ranks above them moved down).
    removed: tuple[int, ...] = ()


def holds_sharded_group(link: CollectiveLink) -> bool:
    """Whether this rank's group made torch's default group (``collective.init_process_group``): a fixed-size mesh."""
    if not LIBRARY_DEFAULT or LIBRARY_DEFAULT[0][0] is not link:
        return False
    import torch.distributed as dist

    return bool(dist.is_initialized())


def renumber(worker: Any, rank: int, world_size: int) -> None:
    """Give ``worker`` (and the role objects of a colocated or fused worker) its new rank and world size.

    Mesh declarations are dropped: a rank's dp rank may follow from its
    number, so ``on_membership_change`` declares them again (nd calls refuse an undeclared mesh).
    """
    roles = [
        *getattr(worker, "_dispatchcore_role_objects", {}).values(),
        *vars(worker).get("_dispatchcore_fused", {}).values(),
    ]
    for obj in (worker, *roles):
        if hasattr(obj, "_rank"):
            obj._rank, obj._world_size = rank, world_size
        if isinstance(getattr(obj, "_dispatch_collect_info", None), dict):
            obj._dispatch_collect_info.clear()
