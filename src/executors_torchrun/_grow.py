"""Growing and shrinking a torchrun group: new ranks join through the lane; removed ones leave with it.

A self-started world hands the new ranks to its spare processes first
(``spare_ranks=k``), then to processes it starts now: every live process
joins the row transport's next generation at the new size
(``SpawnedWorld.add_processes``).  Under the launcher its agent owns
every process: a group grows only onto the launch's idle ranks (hosting no
group), and a removed rank's process goes on serving the others.
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Sequence
from typing import Any

from dispatchcore import DispatchError
from dispatchcore.executor import LOOPBACK, free_port, rank_environment

from ._worlds import KILL_WAIT_S, LaunchWorld, SpawnedWorld, World

#: Why a removed rank's process is gone, as rows fetched from it report it.
REMOVED = "its rank was removed from the group (shrink)"


def _world(executor: Any) -> World:
    if executor.closed:
        raise DispatchError("this torchrun group is shut down")
    world: World = executor._world
    return world


def _idle_launch_ranks(executor: Any, world: LaunchWorld) -> list[int]:
    """The launch's ranks hosting no live group of this driver (each live group answers ``world.dead_ranks``)."""
    busy: set[int] = set()
    for ask in list(world.dead_ranks.values()):
        group = getattr(ask, "__self__", None)
        busy.update(getattr(group, "_data_ranks", ()))
    busy.update(executor._data_ranks)
    return [d for d in range(world.size) if d not in busy]


def add_ranks(executor: Any, count: int) -> dict[str, str]:
    """New ranks: the launch's idle ranks under the launcher, else spare or new processes (see the module doc)."""
    world = _world(executor)
    if isinstance(world, LaunchWorld):
        idle = _idle_launch_ranks(executor, world)
        if len(idle) < count:
            raise DispatchError(
                f"under the torchrun launcher a group grows only onto idle ranks of the launch (ones hosting no "
                f"group): {len(idle)} of its {world.size} are idle ({idle}), {count} asked for. Launch with more "
                "processes (--nproc-per-node), shut down a group placed there, or run the driver without torchrun "
                "(self-started ranks) to grow by starting processes"
            )
        return _open(executor, idle[:count], {})
    assert isinstance(world, SpawnedWorld)  # noqa: S101 - the two kinds of world
    spares = [d for d in world.spares if world.processes[d].poll() is None]
    if len(spares) < count:
        # On failure it ends what it started; the group keeps its ranks (the core reports a dead old one).
        world.add_processes(count - len(spares), executor.spec.world_size + count, executor._start_timeout)
    taken = []
    for _ in range(count):
        d = world.take_spare()
        assert d is not None  # noqa: S101 - counted above, or just started
        taken.append(d)
    n = executor.spec.world_size
    port = free_port(LOOPBACK)
    envs = {g: rank_environment(g, n + count, master_addr=LOOPBACK, master_port=port) for g in range(n, n + count)}
    for g, d in zip(envs, taken, strict=True):
        world.output.label(d, f"rank {g}")
    return _open(executor, taken, envs, {"MASTER_ADDR": LOOPBACK, "MASTER_PORT": str(port)})


def _open(
    executor: Any, data_ranks: list[int], envs: dict[int, dict[str, str]], rendezvous: dict[str, str] | None = None
) -> dict[str, str]:
    """Host the next rank numbers on ``data_ranks`` and open them on the lane at the new size."""
    n = executor.spec.world_size
    added = range(n, n + len(data_ranks))
    executor._data_ranks.extend(data_ranks)
    executor._envs.update(envs)
    executor.resize_spec(n + len(data_ranks))
    try:
        executor.open_ranks(added, executor._start_timeout)
    except BaseException:
        _forget(executor, n, data_ranks, envs)
        raise
    # Under the launcher a process serves several groups: its environment is left alone.
    return {} if rendezvous is None else {**rendezvous, "WORLD_SIZE": str(executor.spec.world_size)}


def _forget(executor: Any, n: int, data_ranks: list[int], envs: dict[int, dict[str, str]]) -> None:
    """Undo a failed ``_open``: the group is back at its ``n`` ranks; self-started processes it took are ended."""
    with executor.lane.membership:
        executor.lane.renumber(range(n), "the grow that added its rank failed")
        del executor._data_ranks[n:]
    for g in envs:
        executor._envs.pop(g, None)
    executor.resize_spec(n)
    world = executor._world
    if isinstance(world, SpawnedWorld):  # a launch's process goes on serving its other groups
        for d in data_ranks:
            world.kill(d, "the grow that took it failed")


def remove_ranks(executor: Any, ranks: Sequence[int]) -> dict[str, str]:
    """End ``ranks``' lane links (their processes leave), wait for them, number the rest ``0..n-1``."""
    world = _world(executor)
    gone = set(ranks)
    keep = [g for g in range(executor.spec.world_size) if g not in gone]
    leaving = [executor._data_ranks[g] for g in sorted(gone)]
    with executor.lane.membership:  # a late death report names the process that served the rank then
        executor.lane.renumber(keep, REMOVED)
        executor._data_ranks = [executor._data_ranks[g] for g in keep]
    executor.resize_spec(len(keep))
    if not isinstance(world, SpawnedWorld):  # a launch's process goes on serving its other groups
        return {}
    for d in leaving:
        proc = world.processes.get(d)
        if proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(KILL_WAIT_S)
        world.mark_dead(d, REMOVED)
        world.kill(d)  # still there after the wait: ended now (and marked gone for row fetches)
    for g, d in enumerate(executor._data_ranks):
        world.output.label(d, f"rank {g}")
    port = free_port(LOOPBACK)
    return {"MASTER_ADDR": LOOPBACK, "MASTER_PORT": str(port), "WORLD_SIZE": str(len(keep))}
