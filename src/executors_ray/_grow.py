"""Growing and shrinking a Ray group: new actors placed like the others, removed ones killed.

A placement group cannot change size, so a pooled group's grow reserves a
new placement group of bundles shaped like the pool's (same strategy); it
is removed once its last rank is gone, or at shutdown.  Without a pool the
new ranks take started spares first, then new actors with the ranks' options.
"""

from __future__ import annotations

import time
import uuid
import weakref
from collections.abc import Sequence
from typing import Any

from dispatchcore import DispatchError

from ._pool import PlacementTimeoutError
from ._tags import CONTROL_GROUP

#: Placement groups a grow reserved, per executor: each with the names of the actors still placed in it.
_reserved: weakref.WeakKeyDictionary[Any, list[tuple[Any, set[str]]]] = weakref.WeakKeyDictionary()


def _check(executor: Any, verb: str) -> None:
    if executor.closed:
        raise DispatchError(f"ray group {executor.spec.name!r} is shut down")
    if executor._detached:
        raise DispatchError(
            f"a detached or attached ray group cannot {verb}: another driver may hold its actors; create a new "
            "group of the size you need"
        )


def add_ranks(executor: Any, count: int) -> dict[str, str]:
    """Start ``count`` actors (placed as the group's), hand them the lane, build their workers at the new size."""
    _check(executor, "grow")
    group, n = executor._rank_actors, executor.spec.world_size
    deadline = time.monotonic() + executor._start_timeout
    options = _placements(executor, count, deadline)
    fresh = []
    for opts in options:
        if executor._pool is None and executor._spares:
            fresh.append(executor._spares.pop(0))
        else:
            fresh.append(executor._start_actor(opts, deadline))
    infos = executor._wait([info for _, info, _ in fresh], deadline, "start the actors of a grow")
    for (actor, _, name), info, opts in zip(fresh, infos, options, strict=True):
        group.actors.append(actor)
        group.names.append(name)
        group.infos.append(info)
        executor._actor_opts.append({**opts, "name": name})
    executor.resize_spec(n + count)
    env = _fresh_env(executor, deadline)
    try:
        executor._open_ranks(range(n, n + count), env)
    except BaseException:
        executor.mark_broken(f"ranks {list(range(n, n + count))} did not start while the group grew")
        raise
    return {key: env[0][key] for key in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE")}


def remove_ranks(executor: Any, ranks: Sequence[int]) -> dict[str, str]:
    """End ``ranks``' lane links, kill their actors (and a grow's placement group left empty), renumber the rest."""
    _check(executor, "shrink")
    group, gone = executor._rank_actors, set(ranks)
    keep = [r for r in range(executor.spec.world_size) if r not in gone]
    executor.lane.renumber(keep, "its rank was removed from the group (shrink)")
    leaving = [group.names[r] for r in sorted(gone)]
    executor._kill(group.actors[r] for r in sorted(gone))
    _unreserve(executor, set(leaving))
    for field in (group.actors, group.names, group.infos, executor._actor_opts):
        kept: list[Any] = [field[r] for r in keep]
        field[:] = kept
    executor._serve_refs = {new: executor._serve_refs[old] for new, old in enumerate(keep)}
    executor._row_addresses.clear()
    executor.resize_spec(len(keep))
    env = _fresh_env(executor, time.monotonic() + executor._start_timeout)
    return {key: env[0][key] for key in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE")}


def release(executor: Any) -> None:
    """At shutdown: remove the placement groups grows reserved (their actors are killed or let go)."""
    for pg, _ in _reserved.pop(executor, []):
        _remove(executor, pg)


def _placements(executor: Any, count: int, deadline: float) -> list[dict[str, Any]]:
    """Actor options for ``count`` new ranks: unique names; a pooled group's in a new placement group."""
    base = {k: v for k, v in executor._actor_opts[0].items() if k not in ("name", "scheduling_strategy")}
    names = [f"{executor.spec.name}-rank{executor.spec.world_size + i}-{uuid.uuid4().hex[:6]}" for i in range(count)]
    pool = executor._pool
    if pool is None:
        return [{**base, "name": name} for name in names]
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    ray = executor.ray
    pg = placement_group([pool.bundle() for _ in range(count)], strategy=pool.strategy)
    if not ray.wait([pg.ready()], timeout=max(0.0, deadline - time.monotonic()))[0]:
        _remove(executor, pg)
        raise PlacementTimeoutError(
            f"ray group {executor.spec.name!r}: a placement group of {count} bundle(s) like the pool's "
            f"({pool.bundle()}, {pool.strategy}) could not be reserved within {executor._start_timeout:g} s "
            f"(start_timeout); the cluster has {ray.available_resources()} available of {ray.cluster_resources()}"
        )
    _reserved.setdefault(executor, []).append((pg, set(names)))
    return [
        {
            **base,
            "name": name,
            "scheduling_strategy": PlacementGroupSchedulingStrategy(
                placement_group=pg, placement_group_bundle_index=i, placement_group_capture_child_tasks=True
            ),
        }
        for i, name in enumerate(names)
    ]


def _fresh_env(executor: Any, deadline: float) -> list[dict[str, str]]:
    """Every rank's variables at the new size, on a fresh rendezvous port of rank 0's node."""
    group = executor._rank_actors
    ask = group.actors[0].describe.options(concurrency_group=CONTROL_GROUP).remote(True)
    port = executor._wait([ask], deadline, "pick a rendezvous port")[0]["port"]
    group.infos[0] = {**group.infos[0], "port": port}
    envs: list[dict[str, str]] = executor._rank_env(group.infos)
    return envs


def _unreserve(executor: Any, names: set[str]) -> None:
    """Remove a grow's placement group once none of its actors is left."""
    kept = []
    for pg, placed in _reserved.get(executor, []):
        placed -= names
        if placed:
            kept.append((pg, placed))
        else:
            _remove(executor, pg)
    if executor in _reserved:
        _reserved[executor] = kept


def _remove(executor: Any, pg: Any) -> None:
    from ray.util.placement_group import remove_placement_group

    try:
        remove_placement_group(pg)
    except Exception:  # noqa: BLE001, S110 - gone with the cluster
        pass
