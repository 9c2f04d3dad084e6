"""``dispatchcore.collective``'s functions: one call inside a worker method, the right path on every backend.

Which path runs is the executor's declared capability, never the backend's
name: ranks that share a process (``Executor.ranks_share_process``, a
:class:`ThreadCollective` on their hosts) reduce in memory; ranks in processes
of their own use the user's default group when it spans exactly this group,
else the group the executor builds on its own store, else raise saying to
initialize a default group.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from .._base import DispatchError, DispatchTimeoutError
from ._collective import (
    DEFAULT_TIMEOUT_S,
    REDUCE_OPS,
    CollectiveLink,
    ThreadCollective,
    made_default_group,
    pickled,
    reduce_in_order,
)
from ._rank_context import call_cancelled, current_collective


@dataclass(frozen=True)
class RankInfo:
    """What a worker may ask about where it runs (named so it never clashes with a worker's own attributes)."""

    #: The executor's name (``"local"``, ``"ray"``, ...): for messages and logs; choose paths by capability.
    backend: str
    #: Whether every rank of the group is a thread of this process (``Executor.ranks_share_process``).
    shares_process: bool
    rank: int
    world_size: int
    #: How many replacements the group went through (collective groups are rebuilt after each).
    generation: int


def rank_info() -> RankInfo:
    """Where the worker method running on this thread runs; raises outside one."""
    link, rank, world_size = current_rank()
    return RankInfo(link.backend, link.shares_process, rank, world_size, link.generation)


def all_reduce(tensor: Any, op: str = "sum", *, timeout: float = DEFAULT_TIMEOUT_S) -> Any:
    """Reduce ``tensor`` in place over every rank of the calling worker's group; returns it.

    ``op`` is one of ``"sum"``, ``"avg"``, ``"product"``, ``"min"``, ``"max"``.
    Every rank of the group must call it, in the same order as its other
    collectives.  On ranks that share a process the reduction runs in rank
    order, so every rank gets the same bits.
    """
    if op not in REDUCE_OPS:
        raise DispatchError(f"op must be one of {', '.join(REDUCE_OPS)}, got {op!r}")
    link, rank, world_size = current_rank()
    if world_size == 1:
        return tensor
    if isinstance(link, ThreadCollective):
        total = reduce_in_order(link.exchange(rank, tensor, timeout), op)
        link.meet(timeout)  # every rank has read every tensor before any is overwritten
        tensor.copy_(total)
        return tensor
    import torch.distributed as dist

    reduce_op = getattr(dist.ReduceOp, {"sum": "SUM", "avg": "SUM", "product": "PRODUCT"}.get(op, op.upper()))
    group = _process_group(link, rank, world_size, timeout)
    if group is None:
        _wait(link, None, dist.all_reduce(tensor, op=reduce_op, async_op=True), timeout)
    else:
        options = dist.AllreduceOptions()
        options.reduceOp, options.timeout = reduce_op, timedelta(seconds=timeout)
        _wait(link, group, group.allreduce([tensor], options), timeout)
    if op == "avg":
        tensor /= world_size
    return tensor


def broadcast(tensor: Any, src: int = 0, *, timeout: float = DEFAULT_TIMEOUT_S) -> Any:
    """Overwrite ``tensor`` on every rank with rank ``src``'s (group ranks); returns it."""
    link, rank, world_size = current_rank()
    if world_size == 1:
        return tensor
    if isinstance(link, ThreadCollective):
        values = link.exchange(rank, tensor if rank == src else None, timeout)
        if rank != src:
            tensor.copy_(values[src])
        link.meet(timeout)  # src's tensor is not written before every rank has copied it
        return tensor
    import torch.distributed as dist

    group = _process_group(link, rank, world_size, timeout)
    if group is None:
        _wait(link, None, dist.broadcast(tensor, src=src, async_op=True), timeout)
    else:
        options = dist.BroadcastOptions()
        options.rootRank, options.timeout = src, timedelta(seconds=timeout)
        _wait(link, group, group.broadcast([tensor], options), timeout)
    return tensor


def broadcast_object(obj: Any, src: int = 0, *, timeout: float = DEFAULT_TIMEOUT_S) -> Any:
    """Rank ``src``'s ``obj`` on every rank (picklable objects; the others' ``obj`` is ignored)."""
    link, rank, world_size = current_rank()
    if world_size == 1:
        return obj
    if isinstance(link, ThreadCollective):
        # Threads share memory: each gets a pickle round trip, as a process would.
        import pickle

        values = link.exchange(rank, pickled(obj) if rank == src else None, timeout)
        link.meet(timeout)
        return pickle.loads(values[src])  # noqa: S301 - bytes from this group's own rank
    import pickle

    import torch

    payload = torch.frombuffer(bytearray(pickled(obj)), dtype=torch.uint8) if rank == src else None
    size = torch.tensor([0 if payload is None else payload.numel()], dtype=torch.int64)
    broadcast(size, src, timeout=timeout)
    buffer = payload if payload is not None else torch.empty(int(size.item()), dtype=torch.uint8)
    broadcast(buffer, src, timeout=timeout)
    return obj if rank == src else pickle.loads(buffer.numpy().tobytes())  # noqa: S301 - this group's own rank


def barrier(*, timeout: float = DEFAULT_TIMEOUT_S) -> None:
    """Return once every rank of the calling worker's group has reached it."""
    link, _rank, world_size = current_rank()
    if world_size == 1:
        return
    if isinstance(link, ThreadCollective):
        link.meet(timeout)
        return
    import torch

    all_reduce(torch.zeros(1), timeout=timeout)  # gloo's barrier needs a registered group; a 1-element reduce does not


def current_rank() -> tuple[CollectiveLink, int, int]:
    """(link, rank, world size) of the worker method running on this thread; raises outside one."""
    found = current_collective()
    if found is None:
        raise DispatchError(
            "dispatchcore.collective runs inside a worker method (or __init__) of a WorkerGroup, on its ranks"
        )
    link, rank, world_size = found
    return link, rank, world_size


def _process_group(link: CollectiveLink, rank: int, world_size: int, timeout: float) -> Any | None:
    """The library's group for ranks in processes of their own; ``None``: the default group spans this group."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and not made_default_group():
        if dist.get_world_size() == world_size and dist.get_rank() == rank:
            return None
    group = link.own_group(rank, world_size, timeout)
    if group is None:
        raise link.missing_group_error()
    return group


def _wait(link: CollectiveLink, group: Any, work: Any, timeout: float) -> None:
    """Wait for a collective; a failure (a peer's group closed by an abort, a timeout) aborts the library's group
    on every rank, so the others leave it too and the next collective runs on a new one."""
    try:
        if group is None:
            work.wait(timedelta(seconds=timeout))  # the default group: the timeout it was built with is not ours
        else:
            work.wait()
    except Exception as exc:
        if group is not None:
            link.abort(group)
        if call_cancelled():
            raise DispatchError("the call was cancelled while its rank waited in a collective") from exc
        if "Timed out" in str(exc):  # gloo's words; as a local rank's timeout reads
            raise DispatchTimeoutError(f"a collective waited {timeout:g}s for the other ranks of its group") from exc
        raise
