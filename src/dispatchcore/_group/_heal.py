"""Healing replaced ranks from a live replica, driver side: which rank gives, and the hand-over itself.

After setup replay a replaced rank holds what setup made, not what training
changed since.  Where the worker defines ``replica_state`` and a replica of
the rank survives (``Worker.replicas``), its state goes rank to rank with
``WeightSync`` (every backend's tensor link; the group hands the class down),
kept on the new rank until the core's ``Operation.HANDOVER`` gives it to
``load_replica_state``; the ranks left with setup's state are named
(``MembershipChange.reset``).  No step names a method: the version read and
the load are that operation, the tensors' arrival WeightSync's ``apply=None``.
The rank half is ``_worker._handover``; see ``docs/replacing-ranks.md``.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from typing import Any

from .._base import DispatchError, WorkerError
from .._spi import Call, Instructions, Operation
from .._worker import MembershipChange, hands_over

_log = logging.getLogger("dispatchcore")

#: The hand-over's instructions: the core's operation, not a worker method.
_HANDOVER = Instructions(operation=Operation.HANDOVER)
#: What the hand-over's calls are named in errors and traces.
HANDOVER_CALL = "<hand-over>"


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
    version = _hand_over(source, ("version",))[0]
    transfer = transfer or source.call_site.shared.membership.transfer
    # apply=None: the tensors wait on each new rank for the load below; no slices asked, no buffers lent.
    transfer(source, destination, offer="replica_state", apply=None, want=None, lend=None, read="replica_state")(
        version
    )
    _hand_over(destination, ("load", version))
    return True


def _hand_over(view: Any, step: tuple[Any, ...]) -> list[Any]:
    """``Operation.HANDOVER``'s ``step`` on every rank of ``view``, through the call pipeline."""
    site = view.call_site
    site.check_open(view)
    n = site.world_size
    call = Call(
        HANDOVER_CALL, site.ranks, [step] * n, [{} for _ in range(n)], site.call_timeout, instructions=_HANDOVER
    )
    values: list[Any] = site.submit(call, view).result()
    return values


def heal(group: Any, change: MembershipChange, transfer: Any, automatic: bool) -> MembershipChange:
    """After the rejoin: hand each replaced rank a live replica's state; ``change`` naming those left reset.

    An ``automatic`` replacement (``on_rank_death="replace"``) that leaves ranks reset logs it.
    """
    if change.reset != change.replaced:
        try:
            given = sources(group, change.replaced)
            for source in sorted(set(given.values())):
                heal_from_replica(group, [r for r, s in given.items() if s == source], source, transfer)
        except (WorkerError, DispatchError) as exc:
            raise _failed(change.replaced, exc) from exc
        reset = tuple(r for r in change.replaced if r not in given)
        change = dataclasses.replace(change, reset=reset) if reset != change.reset else change
    if change.reset and automatic:
        _log.warning("%r: %s", group, reset_note(change, group.worker_cls))
    return change


def _failed(ranks: tuple[int, ...], exc: Exception) -> DispatchError:
    sharded = " (state sharded across ranks, as FSDP2's, has no replica: set replicas = None)"
    return DispatchError(
        f"rank(s) {list(ranks)} were replaced and the group takes calls, but handing them a live "
        f"replica's state failed ({type(exc).__name__}: {exc}); they hold only what setup made"
        f"{sharded if isinstance(exc, ValueError) else ''}. Replace them again "
        f"(wg.replace_rank({', '.join(map(str, ranks))})) or restore a checkpoint"
    )


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


def reset_note(change: MembershipChange | None, worker_cls: type) -> str:
    """Why replaced ranks kept only setup's state, for a user who must hear it ("" when none did)."""
    if change is None or not change.reset:
        return ""
    if len(change.replaced) == change.world_size:
        why = "every rank was replaced at once, so no live replica was left to copy from"
    elif getattr(worker_cls, "replicas", None) is None:
        why = f"{worker_cls.__name__} is sharded (replicas = None): restore them from a checkpoint"
    elif not hands_over(worker_cls):
        why = f"{worker_cls.__name__} defines no replica_state()/load_replica_state() to hand its state over"
    else:
        why = f"no live replica of them on mesh {worker_cls.replicas!r} survived"  # type: ignore[attr-defined]
    return (
        f"rank(s) {list(change.reset)} were replaced and no replica handed them its state ({why}); unless "
        "on_membership_change restored it, they hold only what setup made (docs/replacing-ranks.md)"
    )
