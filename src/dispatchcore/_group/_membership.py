"""Replacing a dead rank, driver side: the setup log, the replacement, one at a time (``docs/replacing-ranks.md``)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from .._base import DispatchError, DispatchValueError, WorkerDiedError, WorkerError, did_you_mean
from .._runtime import isolated_copy
from .._spi import Call, Executor, Instructions, Operation, backends_replacing_ranks, replaces_ranks
from .._worker import REJOIN_CALL, MembershipChange, hands_over
from ._heal import heal
from ._stragglers import Stragglers

#: The rejoin's instructions: the core's operation, not a worker method.
_REJOIN = Instructions(operation=Operation.REJOIN)

#: What a group may do when a call finds a rank dead.
ON_RANK_DEATH = ("raise", "replace")


def check_on_rank_death(value: Any, backend: str, executor_cls: type[Executor]) -> None:
    """Refuse a misspelt ``on_rank_death``, or ``"replace"`` on a backend that cannot, before any rank starts."""
    if value in ON_RANK_DEATH and (value != "replace" or replaces_ranks(executor_cls)):
        return
    able = ", ".join(backends_replacing_ranks()) or "none installed"
    if value == "replace":
        raise DispatchValueError(
            f"on_rank_death='replace' needs a backend that can start a new rank in place of a dead one; "
            f"{backend!r} cannot ({executor_cls.__name__} does not implement replace_ranks). Backends that can: "
            f"{able}. Use on_rank_death='raise' (the default) here"
        )
    hint = did_you_mean(value, ON_RANK_DEATH) if isinstance(value, str) else ""
    raise DispatchValueError(
        f"on_rank_death must be one of {list(ON_RANK_DEATH)}, got {value!r}{hint}; 'replace' starts a new rank "
        f"in place of a dead one (backends that can: {able}) and retries retry=True calls"
    )


#: The class a replaced rank's state hand-over moves tensors with; ``_sync`` registers ``WeightSync``.
_REPLICA_TRANSFER: list[Callable[..., Any]] = []


def use_replica_transfer(transfer: Callable[..., Any]) -> None:
    """Register the transfer class replacements heal with (the layer above calls this on import)."""
    _REPLICA_TRANSFER[:] = [transfer]


class SetupLog:
    """The setup calls of one group (all its role views), in the order they succeeded."""

    def __init__(self) -> None:
        #: Each successful setup call: the method and each rank's arguments (copied).
        self._steps: list[tuple[str, dict[int, tuple[tuple[Any, ...], dict[str, Any]]]]] = []
        self._lock = threading.Lock()

    def record(self, call: Call) -> None:
        """Keep a private copy of ``call``'s per-rank arguments (later driver writes change nothing)."""
        by_rank = {
            rank: isolated_copy((args, kwargs))
            for rank, args, kwargs in zip(call.ranks, call.args, call.kwargs, strict=True)
        }
        with self._lock:
            self._steps.append((call.method, by_rank))

    def for_rank(self, rank: int) -> list[tuple[str, tuple[Any, ...], dict[str, Any]]]:
        """What a new ``rank`` replays: ``(method, args, kwargs)`` in order, skipping calls it was not in."""
        with self._lock:
            steps = list(self._steps)
        return [(method, *by_rank[rank]) for method, by_rank in steps if rank in by_rank]


#: Default of ``WorkerGroup(cancel_grace=...)``: how long ranks asked to stop may take to leave a call.
CANCEL_GRACE_S = 5.0


class Membership:
    """One group's replacement state: its setup log, its stragglers, how many replacements it went through."""

    def __init__(self) -> None:
        self.setup_log = SetupLog()
        self.generation = 0
        #: Ranks still running a call that ended (``_stragglers``); a replacement restarts the stuck ones too.
        self.stragglers = Stragglers()
        self.cancel_grace = CANCEL_GRACE_S
        #: What hands replaced ranks a live replica's state (``_heal``): ``WeightSync``, which the
        #: transfer layer above this one registers on import (:func:`use_replica_transfer`).
        self.transfer: Callable[..., Any] | None = _REPLICA_TRANSFER[0] if _REPLICA_TRANSFER else None
        self._lock = threading.Lock()

    def replace(self, group: Any, ranks: tuple[int, ...], kind: str = "asked for") -> MembershipChange:
        """Replace ``ranks`` of ``group`` now (``kind``: why, for errors), and any rank stuck in an ended call."""
        with self._lock:
            return self._replace(group, ranks, kind)

    def _replace(self, group: Any, ranks: tuple[int, ...], kind: str) -> MembershipChange:
        """New ranks for ``ranks`` (and the stuck ones), setup replay, hook; ``WorkerDiedError`` if another dies."""
        self.generation += 1
        stuck: list[int] = []
        if self.stragglers:
            others = [r for r in range(group.world_size) if r not in ranks]
            stuck = sorted(self.stragglers.settle(others, self.cancel_grace))
            ranks = tuple(sorted({*ranks, *stuck}))
        executor = group.executor
        n = group.world_size
        try:
            env = dict(executor.replace_ranks(ranks))
        except DispatchError as exc:
            if type(exc) is not DispatchError:
                raise
            named = len(ranks) - len(stuck)
            counts = f"{named} {kind}, {len(stuck)} stuck" if stuck and kind != "stuck" else f"{len(ranks)} {kind}"
            plural = "s need" if len(ranks) > 1 else " needs"
            raise DispatchError(f"{len(ranks)} rank{plural} replacing ({counts}); {exc}") from exc
        self.stragglers.forget(ranks)
        survivors = [r for r in range(n) if r not in ranks]
        change = MembershipChange(
            replaced=ranks,
            world_size=n,
            source_rank=survivors[0] if survivors else ranks[0],
            generation=self.generation,
            env=env,
            reset=() if survivors and hands_over(group.worker_cls) else ranks,
        )
        all_ranks = tuple(range(n))
        call = Call(
            REJOIN_CALL,
            all_ranks,
            [(change, self.setup_log.for_rank(r) if r in ranks else []) for r in all_ranks],
            [{} for _ in all_ranks],
            timeout=group.call_timeout,
            instructions=_REJOIN,
        )
        try:
            # Through the call pipeline; the stragglers were settled above.
            group.call_site.submit(call, group, settled=True).result(group.call_timeout)
        except WorkerError as exc:
            raise DispatchError(
                f"rank(s) {list(ranks)} were restarted, but rank {exc.rank} failed to rejoin "
                f"(setup replay or on_membership_change): {exc.exc_type}: {exc.exc_message}. "
                "The group stays broken; shut it down and create a new one"
            ) from exc
        executor.mark_usable()
        if self.transfer is None:
            return change
        return heal(group, change, self.transfer, automatic=kind != "asked for")

    def recover(self, group: Any, dead: int, seen: int) -> MembershipChange | None:
        """``on_rank_death="replace"``: replace ``dead`` (and any found dead on the way), unless done since ``seen``."""
        with self._lock:
            if self.generation != seen:
                return None
            pending = (dead,)
            for _ in range(group.world_size):
                try:
                    return self._replace(group, pending, "dead")
                except WorkerDiedError as again:
                    pending = (again.rank,)
            raise DispatchError(f"{group!r}: ranks kept dying while being replaced; giving up")
