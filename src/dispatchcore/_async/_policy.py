"""Staleness policies: which batches to start (admit), which to hand the trainer (select), which to throw away (evict).

A policy is a small object with three methods the stream calls under its
lock; each sees a :class:`StreamState` snapshot and the batches involved, and
decides alone.  Write your own by subclassing :class:`StalenessPolicy` and
overriding what differs (``docs/async-rl.md`` shows one in a few lines).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .._base import DispatchValueError
from ._batch import RolloutBatch

ORDERS = ("ready", "in_order")
ON_STALE = ("regenerate", "drop")


@dataclass(frozen=True)
class StreamState:
    """What a policy may look at: counts of batches and the versions the driver knows."""

    #: Batches handed to the trainer so far (evicted and lost ones not counted).
    consumed: int
    #: Batches started and not yet taken or thrown away (generating, or finished and waiting).
    live: int
    #: The trainer's version now (``publish`` moves it).
    trainer_version: int
    #: The version the rank about to be admitted holds.
    rollout_version: int
    #: The trainer version the stream started at.
    initial_version: int
    #: How many batches the trainer takes per step (``RolloutStream(batches_per_step=...)``).
    batches_per_step: int
    #: The admission number of the oldest batch still generating (``None``: none is).
    first_generating: int | None = None

    def step_of_next(self) -> int:
        """The trainer version that will consume the next admitted batch, taking batches in admission order."""
        return self.initial_version + (self.consumed + self.live) // self.batches_per_step


class StalenessPolicy:
    """The default policy: admit everything, take ready batches oldest version first, evict nothing."""

    #: ``"regenerate"`` requeues an evicted batch's prompts; ``"drop"`` forgets them.
    on_stale: str = "regenerate"

    def admit(self, state: StreamState) -> bool:
        """Whether a rank may start one more batch now (``False``: it waits for the trainer)."""
        return True

    def select(self, ready: Sequence[RolloutBatch], want: int, state: StreamState) -> list[RolloutBatch]:
        """Up to ``want`` of the finished batches for the trainer (fewer: the stream waits for more)."""
        return sorted(ready, key=lambda b: (b.version, b.seq))[:want]

    def evict(self, batch: RolloutBatch, state: StreamState) -> bool:
        """Whether a finished batch must be thrown away instead of trained on."""
        return False


class MaxStaleness(StalenessPolicy):
    """Every consumed row is at most ``k`` trainer versions old.

    Admission keeps it: a rank starts a batch only if, taken in admission
    order, that batch would be consumed at a trainer version at most ``k``
    past the weights the rank holds (so producers wait, they never make rows
    that would be too old).  Take time checks it again (a batch overtaken by
    ready-first taking, a sync that came late): ``on_stale="regenerate"``
    requeues its prompts, ``"drop"`` forgets them.  ``order="ready"`` takes
    whatever finished first (oldest version first), ``"in_order"`` takes
    batches in the order they were started, waiting for a slow one.
    """

    def __init__(self, k: int, *, order: str = "ready", on_stale: str = "regenerate") -> None:
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise DispatchValueError(f"max staleness k must be an int >= 0 (0: on-policy), got {k!r}")
        if order not in ORDERS:
            raise DispatchValueError(f"order must be one of {ORDERS}, got {order!r}")
        if on_stale not in ON_STALE:
            raise DispatchValueError(f"on_stale must be one of {ON_STALE}, got {on_stale!r}")
        self.k, self.order, self.on_stale = k, order, on_stale

    def admit(self, state: StreamState) -> bool:
        return state.step_of_next() - state.rollout_version <= self.k

    def select(self, ready: Sequence[RolloutBatch], want: int, state: StreamState) -> list[RolloutBatch]:
        if self.order == "ready":
            return super().select(ready, want, state)
        first = state.first_generating
        return [b for b in sorted(ready, key=lambda b: b.seq) if first is None or b.seq < first][:want]

    def evict(self, batch: RolloutBatch, state: StreamState) -> bool:
        return batch.staleness(state.trainer_version) > self.k

    def __repr__(self) -> str:
        return f"MaxStaleness({self.k}, order={self.order!r}, on_stale={self.on_stale!r})"


class AheadBound(StalenessPolicy):
    """Sampling runs at most ``steps`` trainer steps ahead (Tinker's ``sampling_steps_ahead``): bounds admission only.

    Nothing is evicted, so a batch may be consumed older than ``steps`` when
    a weight update comes late; use :class:`MaxStaleness` for a bound on rows.
    """

    def __init__(self, steps: int) -> None:
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
            raise DispatchValueError(f"steps ahead must be an int >= 0, got {steps!r}")
        self.steps = steps

    def admit(self, state: StreamState) -> bool:
        return state.step_of_next() - state.trainer_version <= self.steps

    def __repr__(self) -> str:
        return f"AheadBound({self.steps})"
