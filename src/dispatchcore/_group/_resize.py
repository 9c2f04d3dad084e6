"""Growing and shrinking a group between calls, driver side (``docs/elastic-groups.md``).

A resize waits for the calls in flight, has the executor start or stop
ranks (the rest numbered ``0..n-1`` in order), points the group and its
views at the new world, then runs ``Operation.RESIZE`` on every rank:
new numbers, collectives on a new generation, setup replayed on new ranks,
``on_membership_change``.  A grow then hands the new ranks rank 0's state
where the worker defines a hand-over (``replica_state``), and the current
weights (a ``WeightSync`` into them), before their first call.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Sequence
from typing import Any

from .._base import DispatchError, DispatchValueError, WorkerError
from .._spi import Call, Instructions, Operation
from .._trace import active_tracer, now_us
from .._worker import GroupResized
from ._heal import heal_from_replica
from ._site import CallSite
from ._stuck import clear_stragglers

#: What the core's resize call is called in errors and traces (it names no worker method).
RESIZE_CALL = "<resize>"
_RESIZE = Instructions(operation=Operation.RESIZE)
#: How often a resize looks again at the calls it waits for.
_POLL_S = 0.005


def grow(group: Any, members: Sequence[Any], count: int, sync: Any, version: Any) -> GroupResized:
    """Add ``count`` ranks to ``group`` (its views in ``members``); ``sync``: a ``WeightSync`` into the group."""
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise DispatchValueError(f"grow needs a number of ranks >= 1, got {count!r}")
    if sync is not None and sync.destination is not group:
        raise DispatchValueError(
            f"grow(sync=...) takes a WeightSync whose destination is this group ({group!r}), got one into "
            f"{sync.destination!r}"
        )
    site, started = _quiesce(group, "grow"), now_us()
    n = site.world_size
    executor = site.executor
    with site.shared.membership._lock:
        env = dict(executor.add_ranks(count))
        added = tuple(range(n, n + count))
        _follow(members, n, {r: r for r in range(n)}, n + count)
        change = _rejoin(group, site, n, env, added=added)
    if getattr(group.worker_cls, "replicas", None) == "all":  # DP replicas: rank 0's trained state
        heal_from_replica(group, added, 0)
    if sync is not None:  # before their first call: the new ranks take the source's weights now
        into_new = copy.copy(sync)
        into_new.destination = group.ranks(added)
        into_new(version)
    _mark(site, f"grow {n} -> {n + count}", started)
    return change


def shrink(group: Any, members: Sequence[Any], ranks: Sequence[Any]) -> GroupResized:
    """Remove ``ranks`` from ``group``: their calls over, their kept rows freed (or refused), their ranks stopped."""
    site = group._site
    n = site.world_size
    bad = [r for r in ranks if isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < n]
    if not ranks or bad:
        raise DispatchValueError(f"shrink needs rank numbers in 0..{n - 1}, got {list(ranks)}")
    removed = tuple(sorted(set(ranks)))
    if len(removed) == n:
        raise DispatchValueError(f"shrink({', '.join(map(str, removed))}) would leave no rank; shut the group down")
    site, started = _quiesce(group, "shrink"), now_us()
    keep = [r for r in range(n) if r not in removed]
    mapping = {old: new for new, old in enumerate(keep)}
    _check_rows(site, removed, [r for r in keep if mapping[r] != r])
    with site.shared.membership._lock:
        env = dict(site.executor.remove_ranks(removed))
        site.shared.ledger.renumber(mapping)
        _follow(members, n, mapping, len(keep), removed)
        change = _rejoin(group, site, n, env, removed=removed)
    _mark(site, f"shrink {n} -> {len(keep)}", started)
    return change


def _quiesce(group: Any, verb: str) -> CallSite:
    """The root's site once no call of the group is in flight (each finishes on the old membership)."""
    site: CallSite = group._site
    if group._parent is not None:
        raise DispatchError(f"{verb} resizes the whole group: call it on the group, not on a view ({group!r})")
    site.check_open(group)
    while any(not handle.done() for handle in list(site.shared.calls)) and not site.executor.broken:
        time.sleep(_POLL_S)
    site.check_open(group)  # a call that broke the group meanwhile: say so rather than resize it
    clear_stragglers(group, site)
    _refuse_sharded(group, site, verb)
    return site


def _refuse_sharded(group: Any, site: CallSite, verb: str) -> None:
    """A group whose ranks made torch's default group (a DeviceMesh, FSDP2) cannot change size."""
    ranks = site.ranks
    call = Call(RESIZE_CALL, ranks, [(None, r, []) for r in ranks], [{} for _ in ranks], instructions=_RESIZE)
    sharded = [r for r, held in zip(ranks, group._submit_call(call, settled=True).result(None), strict=True) if held]
    if sharded:
        raise DispatchError(
            f"{group!r} is sharded: rank(s) {sharded} made torch's default process group with "
            f"dispatchcore.collective.init_process_group() (a DeviceMesh, FSDP2), which cannot change size. "
            f"To {verb} it, save a checkpoint, create a group of the new size and re-shard from the checkpoint"
        )


def _check_rows(site: CallSite, removed: tuple[int, ...], moved: list[int]) -> None:
    """Free the rows queued for release on the ranks that go or move; refuse while rows still referenced live there."""
    ledger = site.shared.ledger
    site.shared.ledger.flush()
    held = ledger.held_on([*removed, *moved])
    if held:
        where = ", ".join(f"rank {r}: {b:,} bytes" for r, b in sorted(held.items()))
        raise DispatchError(
            f"shrink({', '.join(map(str, removed))}) would lose lazy results still referenced ({where}); "
            "materialize them (.materialize()) or drop them first. Ranks above a removed one are renumbered, "
            "so their kept rows count too; removing the highest ranks moves none"
        )


def _follow(members: Sequence[Any], n: int, mapping: dict[int, int], size: int, removed: tuple[int, ...] = ()) -> None:
    """Point the group and its views at the new world: whole-group ones follow it; others keep their ranks."""
    whole = tuple(range(n))
    for member in members:
        site = member._site
        member._mesh_cache.clear()  # meshes are asked again at the new size
        if site.ranks == whole:
            site.ranks = tuple(range(size))
        elif any(r in removed for r in site.ranks):
            gone = [r for r in site.ranks if r in removed]
            site.refused = (
                f"it names rank(s) {gone}, which shrink removed; take a new view of the group "
                f"(now {size} rank{'s' if size > 1 else ''})"
            )
            continue
        else:
            site.ranks = tuple(mapping[r] for r in site.ranks)
        site.world_size = len(site.ranks)


def _rejoin(
    group: Any,
    site: CallSite,
    n: int,
    env: dict[str, str],
    *,
    added: tuple[int, ...] = (),
    removed: tuple[int, ...] = (),
) -> GroupResized:
    """Every rank takes its number and the new size; new ranks replay setup (rank 0's arguments); the hook runs."""
    membership = site.shared.membership
    membership.generation += 1
    size = n + len(added) - len(removed)
    change = GroupResized(
        replaced=added,
        world_size=size,
        source_rank=0,
        generation=membership.generation,
        env=env,
        previous_world_size=n,
        added=added,
        removed=removed,
    )
    ranks = tuple(range(size))
    replay = membership.setup_log.for_rank(0) if added else []
    args = [(change, r, replay if r in added else []) for r in ranks]
    call = Call(RESIZE_CALL, ranks, args, [{} for _ in ranks], timeout=site.call_timeout, instructions=_RESIZE)
    try:
        group._submit_call(call, settled=True).result(site.call_timeout)
    except WorkerError as exc:
        reason = f"rank {exc.rank} failed to rejoin after a resize: {exc.exc_type}: {exc.exc_message}"
        site.executor.mark_broken(reason)
        raise DispatchError(f"{reason}. The group stays broken; shut it down and create a new one") from exc
    return change


def _mark(site: CallSite, what: str, started: float) -> None:
    """A slice on the group's membership track of an open trace (``dispatchcore.trace``)."""
    tracer = active_tracer()
    if tracer is not None:
        tracer.slice(f"{site.shared.label} membership", what, started, now_us(), world_size=site.world_size)
