"""What the driver and a rank actor agree on: tags, call layouts, the forwarded-chunk placeholder.

A leaf module (it imports nothing else of ``executors_ray``), so the driver
side (``_executor``, ``_handle``) and the actor side (``_actor``,
``_forward``) can share it without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dispatchcore.executor import ChunkPlan, Instructions

#: What a rank answers when the result is not sent as it is:
#: ``(OK_PACKED, packed value)`` or ``(FAILED, RemoteFailure)``.  Anything that
#: is not a tuple (an atom, an ``ObjectRef``) is the result itself.
OK_PACKED, FAILED = 1, 2

#: Kinds of argument a rank receives (one per distinct value of a call):
#: passed as it is, packed by ``_payload``, or a chunk of another call's
#: results that the rank fetches itself (:class:`Forwarded`).
RAW, PACKED, FORWARD = 0, 1, 2

#: Concurrency group of the control methods (descriptions, joining the lane, stacks): one thread
#: beside the worker's, so a busy rank still answers.
CONTROL_GROUP = "control"

#: Concurrency group serving lazy results' rows (other ranks' fetches, the driver's reads and
#: frees): its own threads, so a rank busy with a long call still serves the rows it keeps.
ROWS_GROUP = "rows"
ROWS_THREADS = 2

#: Added to a rank's number in the lane handshake of its control link (its call link uses the rank itself).
CONTROL_LINK = 1 << 30

#: A call's layout: ``(arg_slots, kwarg_slots, kinds, sources, inline, instructions)``.
#: Per distinct value: its kind and where it is: ``inline[i]`` (source
#: ``-1``), top-level value ``j`` (source ``j``: an argument of the Ray task
#: bringing the values, a reference Ray resolves) or element ``k`` of
#: top-level value ``j`` (``(j, k)``, one object holding several ranks' chunks).
#: ``instructions`` is ``Call.instructions``, forwarded whole.
Layout = tuple[tuple[int, ...], dict[str, int], tuple[int, ...], tuple[Any, ...], tuple[Any, ...], Instructions]


def bare_layout(instructions: Instructions) -> Layout:
    """The layout of a call without arguments that still carries the core's instructions (traced, lazy)."""
    return ((), {}, (), (), (), instructions)


@dataclass
class Forwarded:
    """One consuming rank's chunk of another call's results: the core's plan plus the references it reads."""

    refs: dict[int, Any]
    plan: ChunkPlan
