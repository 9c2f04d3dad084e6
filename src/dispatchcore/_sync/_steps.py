"""The driver's side of one transfer step: a core call on some ranks of one group, errors named by group.

Every step is a call of ``TRANSFER_METHOD`` through the group's own
executor, so each inherits that executor's time bounds and death detection
(``RankCallHandle``); only the wording is added here, saying which group
(source or destination) lost which rank, and a destination that could not
read a bucket because its source is gone is reported as that source's death.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .._base import DispatchError, WorkerDiedError, WorkerError
from .._spi import Call, CallHandle, Executor
from .._transfer import TRANSFER_METHOD


@dataclass(frozen=True)
class Side:
    """One group of a transfer: its executor, the executor ranks it calls, its role prefix and bounds."""

    role: str
    label: str
    executor: Executor
    ranks: tuple[int, ...]
    prefix: str
    timeout: float | None
    isolate: bool


def submit(side: Side, positions: Sequence[int], args: Sequence[tuple[Any, ...]]) -> CallHandle:
    """Start one step on ``positions`` of ``side`` (results are fresh: no isolation copy)."""
    ranks = tuple(side.ranks[p] for p in positions)
    call = Call(TRANSFER_METHOD, ranks, list(args), [{} for _ in ranks], timeout=side.timeout, results_are_copied=True)
    try:
        return side.executor.submit(call)
    except DispatchError:
        raise
    except Exception as exc:
        raise DispatchError(f"{side.role} group {side.label} could not start a weight transfer step: {exc}") from exc


def wait(side: Side, handle: CallHandle, what: str, source: Side | None = None, source_rank: int = -1) -> list[Any]:
    """The step's per-rank values; a death names the group and rank, a lost bucket names its source."""
    try:
        return handle.result(side.timeout)
    except WorkerDiedError as exc:
        raise WorkerDiedError(
            exc.rank, f"{side.role} group {side.label} lost it during the weight transfer ({what}): {exc.detail}"
        ) from exc
    except WorkerError as exc:
        if exc.exc_type == "TensorSourceLost" and source is not None:
            raise WorkerDiedError(
                source_rank,
                f"source group {source.label} lost it during the weight transfer: destination rank {exc.rank} "
                f"could not read a bucket it sent ({exc.exc_message})",
            ) from exc
        raise
