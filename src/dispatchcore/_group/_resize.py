"""Growing and shrinking a group between calls, driver side (``docs/elastic-groups.md``).

A resize waits for the calls in flight, has the executor start or stop
ranks (the rest numbered ``0..n-1`` in order), points the group and its
views at the new world, then runs ``Operation.RESIZE`` on every rank:
new numbers, collectives on a new generation, setup replayed on new ranks,
``on_membership_change``.  A grow then hands the new ranks rank 0's state
where the worker defines a hand-over (``replica_state``), and the current
weights (a ``WeightSync`` into them), before their first call; a grow that fails removes them again.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from .._base import DispatchError, DispatchValueError, WorkerDiedError, WorkerError
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
#: After a grow could not start its ranks: how long the old ones are asked whether they live.
_PROBE_S = 10.0


def grow(group: Any, members: Sequence[Any], count: int, sync: Any, version: Any) -> GroupResized:
    """Add ``count`` ranks to ``group`` (its views in ``members``); ``sync``: a ``WeightSync`` into the group.

    A grow that fails removes the ranks it added: the old ones keep serving at the old size, and the
    error names the phase (an old rank that died is reported as a death, ``WorkerDiedError``).
    """
    _check_grow(group, count, sync)
    copy_back, version = _weights_plan(sync, version)
    site, started = _quiesce(group, "grow"), now_us()
    n = site.world_size
    added = tuple(range(n, n + count))
    with site.shared.membership._lock:
        env = _start_ranks(group, site, n, count)
        _follow(members, n, {r: r for r in range(n)}, n + count)
        try:
            change = _rejoin(group, site, n, env, added=added, undoable=True)
        except Exception as exc:
            raise _undo_grow(group, site, members, n, added, "every rank took the new size", exc) from exc
    try:
        if getattr(group.worker_cls, "replicas", None) == "all":  # DP replicas: rank 0's trained state
            heal_from_replica(group, added, 0)
        if copy_back:  # the old ranks hold ``version``: the new ones get those bytes, whatever the source holds now
            sync.copy_back(group.ranks(list(range(n))), group.ranks(list(added)), version)
        elif sync is not None:  # another version (or the old ranks may disagree): every rank, from the source
            sync(version)
    except Exception as exc:
        with site.shared.membership._lock:
            raise _undo_grow(group, site, members, n, added, "the new ranks took their state", exc) from exc
    _mark(site, f"grow {n} -> {n + count}", started)
    return change


def _check_grow(group: Any, count: Any, sync: Any) -> None:
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise DispatchValueError(f"grow needs a number of ranks >= 1, got {count!r}")
    if sync is not None and sync.destination is not group:
        raise DispatchValueError(
            f"grow(sync=...) takes a WeightSync whose destination is this group ({group!r}), got one into "
            f"{sync.destination!r}"
        )


def _weights_plan(sync: Any, version: Any) -> tuple[bool, Any]:
    """``(copy_back, version)``: whether the new ranks copy the old ranks' weights, and the version they get.

    ``version=None`` means the version the old ranks hold.  Where they hold ``version`` (the last
    transfer, complete), the new ranks take those bytes from an old rank; otherwise (another
    version, no transfer yet, or one that failed half-way) every rank is synced from the source.
    """
    if sync is None:
        return False, version
    if version is None and sync.holds(sync.last_version):
        version = sync.last_version
    if not sync.holds(version):
        return False, version
    why = sync.cannot_copy_back()
    if why is not None:
        raise DispatchError(
            f"grow(sync=..., version={version!r}): the old ranks hold version {version!r}, which the source may "
            f"have moved past, so the new ranks take the same bytes from an old rank; but {why}. Define it, or "
            "grow with a new version (every rank is then synced from the source). Nothing was changed"
        )
    return True, version


def _start_ranks(group: Any, site: CallSite, n: int, count: int) -> dict[str, str]:
    """The executor's new ranks and their environment; when it cannot start them, the error says why."""
    try:
        return dict(site.executor.add_ranks(count))
    except Exception as exc:
        dead = _dead_rank(site, n)
        if dead is not None:
            raise WorkerDiedError(dead, f"it died while grow({count}) started the new ranks ({exc})", "<grow>") from exc
        broken = site.executor.broken
        exc.add_note(
            f"grow({count}) did not start its ranks; the {site.shared.backend!r} backend can take no more calls "
            f"({broken})"
            if broken
            else f"grow({count}) did not start its ranks; the group keeps its {n} rank{'s' if n > 1 else ''}"
        )
        raise


def _dead_rank(site: CallSite, n: int) -> int | None:
    """The lowest of ranks ``0..n-1`` that is gone (asked with an empty core operation), or ``None``."""
    ranks = tuple(range(n))
    call = Call(RESIZE_CALL, ranks, [(None, r, []) for r in ranks], [{} for _ in ranks], instructions=_RESIZE)
    try:
        site.executor.submit(call).result(min(site.executor.spec.death_timeout, _PROBE_S))
    except WorkerDiedError as exc:
        return exc.rank if exc.rank in ranks else None
    except Exception:  # noqa: BLE001 - only a death is reported as one; the grow's own error says the rest
        return None
    return None


def _undo_grow(
    group: Any, site: CallSite, members: Sequence[Any], n: int, added: tuple[int, ...], phase: str, exc: Exception
) -> Exception:
    """Remove the ranks a failed grow added and put the old ones back at size ``n``; the error to raise."""
    died = exc.rank if isinstance(exc, WorkerDiedError) and exc.rank < n else None
    try:
        env = dict(site.executor.remove_ranks(added))
        _follow(members, n + len(added), {r: r for r in range(n)}, n, added)
        if died is None:
            _rejoin(group, site, n + len(added), env, removed=added, undoable=True)
    except Exception as undo:  # noqa: BLE001 - the grow's error is the one to raise; this one is its note
        site.executor.mark_broken(f"a failed grow could not be undone ({undo})")
        error = DispatchError(
            f"grow({len(added)}) failed before {phase} ({type(exc).__name__}: {exc}), and removing the new ranks "
            f"failed too ({undo}): the group can take no more calls; shut it down and create a new one"
        )
        return error
    if died is not None:
        detail = f"it died while the group grew, before {phase} ({exc}); the new ranks were removed"
        return WorkerDiedError(died, detail, "<grow>")
    rank = getattr(exc, "rank", None)
    who = f"rank {rank}: " if isinstance(rank, int) else ""
    return DispatchError(
        f"grow({len(added)}) failed before {phase} ({who}{type(exc).__name__}: "
        f"{getattr(exc, 'exc_message', None) or exc}); the new ranks were removed and the group keeps its {n} "
        f"rank{'s' if n > 1 else ''}"
    )


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
        if site.refused is not None:  # a view that named a removed rank stays refused, whatever the world does
            continue
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
    undoable: bool = False,
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
        if undoable:
            raise
        reason = f"rank {exc.rank} failed to rejoin after a resize: {exc.exc_type}: {exc.exc_message}"
        site.executor.mark_broken(reason)
        raise DispatchError(f"{reason}. The group stays broken; shut it down and create a new one") from exc
    return change


def _mark(site: CallSite, what: str, started: float) -> None:
    """A slice on the group's membership track of an open trace (``dispatchcore.trace``)."""
    tracer = active_tracer()
    if tracer is not None:
        tracer.slice(f"{site.shared.label} membership", what, started, now_us(), world_size=site.world_size)
