"""The stacks hook of the call pipeline: a call that timed out says where its unfinished ranks are.

Asking costs a round trip to each rank beside its running call, so it is
bounded (:data:`STACKS_TIMEOUT_S`) and best effort: a rank that does not
answer, or a backend that cannot ask, leaves the error as it was.
"""

from __future__ import annotations

from .._base import DispatchTimeoutError
from .._runtime import stacks_note
from ._site import CallSite

#: How long a timed-out call waits for its ranks' stacks before raising without them.
STACKS_TIMEOUT_S = 2.0


def note_stacks(site: CallSite, error: DispatchTimeoutError) -> None:
    """Add the stacks of the ranks ``error`` names to it, as a note."""
    ranks = list(getattr(error, "ranks", ()) or ())
    if not ranks:
        return
    try:
        stacks = site.executor.rank_stacks(ranks, False, STACKS_TIMEOUT_S)
    except Exception:  # noqa: BLE001 - the error being raised matters more than its decoration
        return
    if stacks:
        error.add_note(stacks_note(stacks))
