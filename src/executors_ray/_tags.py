"""What the driver and a rank actor agree on: tags, concurrency groups, the forwarded-chunk placeholder."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dispatchcore.executor import ChunkPlan

#: What a rank's row read or free (and a row fetch) answers:
#: ``(OK_PACKED, packed value)`` or ``(FAILED, RemoteFailure or message)``.
OK_PACKED, FAILED = 1, 2

#: Concurrency group of the control methods (descriptions, identity): one thread
#: beside the worker's, so a busy rank still answers.
CONTROL_GROUP = "control"

#: Concurrency group serving lazy results' rows (other ranks' fetches, the driver's reads and
#: frees) and the object store's side of the lane (stashed values, kept results): its own
#: threads, so a rank busy with a long call still serves the rows it keeps.
ROWS_GROUP = "rows"
ROWS_THREADS = 2

#: Concurrency group whose one thread serves the driver's lane: the rank's method thread
#: (every call and the worker's ``__init__`` run there).
LANE_GROUP = "lane"

#: Concurrency group serving the lanes of groups made of running actors (verl's ``worker_handles``)
#: while the actors' own lane is up: a thread per such lane.
BESIDE_GROUP = "beside"
BESIDE_THREADS = 4


@dataclass
class Forwarded:
    """One consuming rank's chunk of another call's results: the core's plan plus the references it reads."""

    refs: dict[int, Any]
    plan: ChunkPlan
