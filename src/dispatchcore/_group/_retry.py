"""The replacement hook of the call pipeline: a call that found one of its ranks dead (``docs/replacing-ranks.md``)."""

from __future__ import annotations

from typing import Any

from .._base import WorkerDiedError
from .._dispatch import Registration
from ._heal import reset_note
from ._site import CallSite


def should_retry(
    group: Any,
    site: CallSite,
    exc: WorkerDiedError,
    registration: Registration,
    method: str,
    generation: int,
    retried: bool,
) -> bool:
    """After ``exc`` ended a call: replace the dead rank if the group says so; whether to run the call again.

    Raises ``exc`` (noted) when the rank was replaced but the call is not safe to run twice.
    """
    if exc.seen_by is not None:  # a producing rank (maybe of another group) died, not ours
        return False
    shared = site.shared
    shared.ledger.dead.add(exc.rank)
    if shared.on_rank_death != "replace" or retried:
        return False
    root = shared.root() if shared.root is not None else None
    change = shared.membership.recover(root if root is not None else group, exc.rank, generation)
    if not registration.retry:
        exc.add_note(
            f"rank {exc.rank} was replaced (on_rank_death='replace') and the group takes calls "
            f"again; {method!r} was not retried: register it with retry=True if it is safe to run twice"
        )
        reset = reset_note(change, (root if root is not None else group).worker_cls)
        if reset:
            exc.add_note(reset)
        raise exc
    return True
