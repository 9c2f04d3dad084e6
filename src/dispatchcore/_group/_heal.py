"""Healing replaced ranks from a live replica, driver side: which rank gives, and the hand-over itself.

After setup replay a replaced rank holds what setup made, not what training
changed since.  Where the worker defines ``replica_state`` and a replica of
the rank survives (``Worker.replicas``), its state goes rank to rank with
``WeightSync`` (every backend's tensor link; the group hands the class down) into the new rank's
``load_replica_state``; the ranks left with setup's state are named
(``MembershipChange.reset``).  The rank half is ``_worker._handover``; see
``docs/replacing-ranks.md``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from .._worker import MembershipChange, hands_over

#: A hook name no worker defines: the hand-over never asks for slices nor lends buffers.
_NO_HOOK = "_dispatchcore_no_hook"


def heal_from_replica(group: Any, new_ranks: Sequence[int], source_rank: int, transfer: Any = None) -> bool:
    """Give ``new_ranks`` of ``group`` (a root ``WorkerGroup``) the state of ``source_rank``, a live replica.

    Runs ``replica_state()`` on the source and ``load_replica_state(state)``
    once on each new rank, with the source's ``weights_version``; ``False``
    (nothing moved) where the worker defines no hand-over.  A dead rank on
    the way raises ``WorkerDiedError``.  ``transfer`` is ``WeightSync``
    (default: the one the group was given).
    """
    if not new_ranks or not hands_over(group.worker_cls):
        return False
    source, destination = group.ranks([source_rank]), group.ranks(new_ranks)
    version = source.execute_all("_dispatchcore_weights_version")[0]
    transfer = transfer or group._site.shared.membership.transfer
    transfer(
        source,
        destination,
        offer="replica_state",
        apply="_dispatchcore_replica_part",
        want=_NO_HOOK,
        lend=_NO_HOOK,
        read="replica_state",
    )(version)
    destination.execute_all("_dispatchcore_replica_load", version)
    return True


def heal(group: Any, change: MembershipChange, transfer: Any) -> MembershipChange:
    """After the rejoin: hand each replaced rank a live replica's state; ``change`` naming those left reset."""
    if change.reset == change.replaced:
        return change
    given = sources(group, change.replaced)
    for source in sorted(set(given.values())):
        heal_from_replica(group, [r for r, s in given.items() if s == source], source, transfer)
    reset = tuple(r for r in change.replaced if r not in given)
    return dataclasses.replace(change, reset=reset) if reset != change.reset else change


def sources(group: Any, replaced: Sequence[int]) -> dict[int, int]:
    """Each replaced rank that has a live replica, and the rank it takes its state from.

    ``replicas = "all"``: the lowest survivor.  A mesh name: the rank at
    the same place (by rank order) in another dp group of that mesh.
    """
    survivors = [r for r in range(group.world_size) if r not in replaced]
    mesh = group.worker_cls.replicas
    if not survivors or mesh is None:
        return {}
    if mesh == "all":
        return {r: survivors[0] for r in replaced}
    layout = [dp for dp, _ in group.mesh_ranks(mesh)]
    members: dict[int, list[int]] = {}
    for rank, dp in enumerate(layout):
        members.setdefault(dp, []).append(rank)
    found = {}
    for rank in replaced:
        place = members[layout[rank]].index(rank)
        live = [m[place] for dp, m in sorted(members.items()) if len(m) > place and m[place] in survivors]
        if live:
            found[rank] = live[0]
    return found
