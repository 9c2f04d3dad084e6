"""Rejoining after a replacement, rank side: what changed, and the rejoin every rank runs (``Operation.REJOIN``).

The driver half (the setup log, starting the new ranks) is
:mod:`dispatchcore._group._membership`; this half runs on the ranks, so the
worker layer holds it and the group layer imports it, never the other way.
"""

from __future__ import annotations

import asyncio
import inspect
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ._rank_context import current_collective
from ._sharded import run_hooks

#: What the core's rejoin call is called in errors and traces (it names no worker method).
REJOIN_CALL = "<rejoin>"


@dataclass(frozen=True)
class MembershipChange:
    """What every rank learns after ranks were replaced (argument of the hook)."""

    #: Ranks now hosted by new processes (their state came from ``__init__`` and setup replay, then from a
    #: live replica where the worker defines ``replica_state``).
    replaced: tuple[int, ...]
    world_size: int
    #: The lowest surviving rank: the one to copy state from.
    source_rank: int
    #: How many replacements this group has gone through (1 after the first).
    generation: int
    #: Rendezvous variables (``MASTER_ADDR``/``MASTER_PORT``) for a rebuilt
    #: ``torch.distributed`` world; already in ``os.environ`` when the hook runs.
    env: Mapping[str, str] = field(default_factory=dict)
    #: Replaced ranks whose state is only what setup made: the worker defines no ``replica_state``, is
    #: sharded (``replicas = None``), or no live replica was left.  In the hook it says what the driver
    #: knew before the hand-over; ``replace_rank`` returns the final answer (a mesh replica found missing).
    reset: tuple[int, ...] = ()

    def is_new(self, rank: int) -> bool:
        """Whether ``rank`` is one of the replacement processes."""
        return rank in self.replaced


def rejoin(worker: Any, change: MembershipChange, replay: list[tuple[str, tuple[Any, ...], dict[str, Any]]]) -> None:
    """Rank side of a replacement: adopt the new rendezvous, replay setup, run the hooks.

    ``on_membership_change`` first; then, in a worker that declares
    ``sharded_modules`` and defines ``recover_sharded_state``, that hook on
    every rank, survivors included: a new rank's FSDP2 state is setup's, a
    survivor's whatever its last call left (a root unsharded by a no-grad
    forward), and only the same rebuild on every rank makes them issue the
    same collectives (``docs/replacing-ranks.md``).
    """
    os.environ.update(change.env)
    collective = current_collective()
    if collective is not None:  # dispatchcore.collective's groups: every rank moves to the new generation
        collective[0].rebuild(change.generation)
    for method, args, kwargs in replay:
        value = getattr(worker, method)(*args, **kwargs)
        if inspect.isawaitable(value):
            asyncio.run(_await(value))
    worker.on_membership_change(change)
    run_hooks(worker)


async def _await(value: Any) -> Any:
    return await value
