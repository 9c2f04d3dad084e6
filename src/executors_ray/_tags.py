"""What the driver and a rank actor agree on: tags, concurrency groups, the forwarded-chunk placeholder."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dispatchcore.executor import ChunkPlan

#: What a rank answers another rank's fetch of its kept rows: ``(OK_PACKED, packed)`` or ``(FAILED, message)``.
OK_PACKED, FAILED = 1, 2

#: The actor's concurrency groups, each beside the worker's thread so a busy rank still answers:
#: control methods (descriptions, identity), one thread.
CONTROL_GROUP = "control"

#: Lazy results' rows (fetches, the driver's reads and frees) and the lane's object store side.
ROWS_GROUP = "rows"
ROWS_THREADS = 2

#: The driver's lane: its one thread is the rank's method thread (every call and ``__init__``).
LANE_GROUP = "lane"

#: verl's non-blocking calls: each rank's outcome handed to a Ray ref once the driver has it (a thread per
#: outstanding call; more wait their turn).
HANDOVER_GROUP = "handover"
HANDOVER_THREADS = 8

#: Lanes of groups made of running actors (verl's ``worker_handles``): a thread per such lane.
BESIDE_GROUP = "beside"
BESIDE_THREADS = 4


@dataclass
class Forwarded:
    """One consuming rank's chunk of another call's results: the core's plan plus the references it reads."""

    refs: dict[int, Any]
    plan: ChunkPlan


@dataclass
class Raised:
    """An outcome that is an error: the rank's ``hand_over`` raises it (verl's ``ray.get`` then does)."""

    error: BaseException
