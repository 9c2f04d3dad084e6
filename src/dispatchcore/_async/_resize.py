"""A rollout group growing or shrinking under a running ``RolloutStream``.

A resize waits for the group's calls in flight, and the stream keeps one on
every rank: so the stream is held first (it starts nothing, its running
calls finish and are collected), the group resized, the stream's ranks
rebuilt, and the hold let go.  Grown ranks are *fresh*: the stream syncs
them from ``weights_from`` to the trainer's version before they generate.
A shrink renumbers the ranks above a removed one, and refuses while rows a
driver still references live on ranks that go or move: the stream's
waiting batches there are dropped and their prompts regenerated first.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

from .._base import DispatchError, DispatchValueError
from ._batch import LostBatch


@contextlib.contextmanager
def _held(stream: Any) -> Iterator[None]:
    """The stream starts nothing while the block runs; on entry every running call has been collected."""
    with stream._cond:
        if stream._closing or stream._closed:
            raise DispatchError("this rollout stream is closed: resize the group itself")
        stream._held = True
        stream._cond.notify_all()
        while any(slot.busy for slot in stream._slots) and stream._fatal is None:
            stream._cond.wait(0.05)
    try:
        yield
    finally:
        with stream._cond:
            stream._held = False
            stream._cond.notify_all()


def grow_stream(stream: Any, count: int, options: dict[str, Any]) -> Any:
    """``stream.grow``: the group grows; one fresh slot per new rank."""
    with _held(stream):
        change = stream.group.grow(count, **options)
        with stream._cond:
            for rank in range(len(stream._slots), stream.group.world_size):
                slot = stream._slot(rank, stream.trainer_version)
                slot.fresh = True
                stream._slots.append(slot)
    return change


def shrink_stream(stream: Any, ranks: Sequence[Any]) -> Any:
    """``stream.shrink``: the batches waiting on ranks that go or move regenerate; the slots follow the ranks."""
    if len(ranks) == 1 and isinstance(ranks[0], (list, tuple, range)):
        ranks = tuple(ranks[0])
    with _held(stream):
        n = len(stream._slots)
        removed = {r for r in ranks if isinstance(r, int) and not isinstance(r, bool) and 0 <= r < n}
        if len(removed) != len(ranks):
            raise DispatchValueError(f"shrink needs rank numbers in 0..{n - 1}, got {list(ranks)}")
        keep = [r for r in range(n) if r not in removed]
        moved = {old for new, old in enumerate(keep) if new != old}
        with stream._cond:
            for batch in [b for b in stream._ready if b.rank in removed or b.rank in moved]:
                stream._ready.remove(batch)
                why = DispatchError(f"rank {batch.rank} was {'removed' if batch.rank in removed else 'renumbered'}")
                stream.lost.append(LostBatch(batch.seq, batch.rank, why, True))
                stream._requeued.append((batch.prompts, batch.attempt))
                batch.data = None  # the rows there are freed: the shrink would refuse while they are referenced
        change = stream.group.shrink(*sorted(removed))
        with stream._cond:
            kept = [stream._slots[old] for old in keep]
            for new, slot in enumerate(kept):
                slot.rank, slot.proxy = new, stream._slot(new).proxy
            stream._slots = kept
            stream._syncs.clear()  # each rollout rank's transfer is planned again at its new number
    return change
