"""The driver's side of one transfer step: a core call on some ranks of one group, errors named by group.

Every step is a call of the core's transfer operation (``Operation.TRANSFER``)
through the call pipeline (the group's ``call_site.submit``), so each is traced, settles stragglers,
reads the same when a backend refuses it, and inherits that executor's time
bounds and death detection (``RankCallHandle``); only the wording is added
here, saying which group (source or destination) lost which rank, and a
destination that could not read a bucket because its source is gone is
reported as that source's death.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .._base import DispatchError, WorkerDiedError, WorkerError
from .._spi import Call, Executor, Instructions, Operation
from .._transfer import TRANSFER_METHOD

#: Every step's instructions: run the transfer step, not a worker method.
_TRANSFER = Instructions(operation=Operation.TRANSFER)


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
    #: The group (or view) itself, which errors name.
    group: Any = None
    #: Its ``CallSite``: the steps go through the call pipeline (``call_site.submit``).
    site: Any = None
    #: Its ranks' tracks in a trace are ``f"{track} rank {rank}"``, as its calls' are.
    track: str = ""

    @classmethod
    def of(cls, role: str, wg: Any) -> Side:
        """The side a ``WorkerGroup`` (or a view of one) plays in a transfer."""
        executor = wg.executor
        ranks = tuple(wg.rank_ids)
        track = getattr(wg, "trace_label", None) or repr(wg)
        label = repr(wg)
        isolate = executor.spec.isolate
        return cls(role, label, executor, ranks, wg.role_prefix, wg.call_timeout, isolate, wg, wg.call_site, track)


def submit(side: Side, positions: Sequence[int], args: Sequence[tuple[Any, ...]]) -> Any:
    """Start one step on ``positions`` of ``side`` (results are fresh: no isolation copy).

    Returns what the group's submit path does: ``result(timeout)`` and ``done()``.
    """
    ranks = tuple(side.ranks[p] for p in positions)
    call = Call(TRANSFER_METHOD, ranks, list(args), [{} for _ in ranks], side.timeout, True, _TRANSFER)
    try:
        return side.site.submit(call, side.group)
    except DispatchError as exc:
        exc.add_note(f"(a weight transfer step on the {side.role} group {side.label})")
        raise


def wait(side: Side, sent: Any, what: str, source: Side | None = None) -> list[Any]:
    """The step's per-rank values; a death names the group and rank, a lost bucket names its source.

    A destination that lost a bucket says which source position sent it (``[bucket i of source s]``).
    """
    try:
        values: list[Any] = sent.result(side.timeout)
    except WorkerDiedError as exc:
        raise WorkerDiedError(
            exc.rank, f"{side.role} group {side.label} lost it during the weight transfer ({what}): {exc.detail}"
        ) from exc
    except WorkerError as exc:
        sender = re.search(r"of source (\d+)\]", exc.exc_message or "")
        if exc.exc_type == "TensorSourceLost" and source is not None and sender is not None:
            raise WorkerDiedError(
                source.ranks[int(sender.group(1))],
                f"source group {source.label} lost it during the weight transfer: destination rank {exc.rank} "
                f"could not read a bucket it sent ({exc.exc_message})",
            ) from exc
        raise
    return values
