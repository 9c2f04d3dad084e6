"""Growing and shrinking a torchrun group: spare processes take new ranks; removed ones leave with their lane.

A self-started world's processes share one row transport, sized when the
world starts, so a grow hands the new ranks to spare processes started with
the group (``spare_ranks=k``); they join through the lane like any rank.
Under the launcher its agent owns every process: the group keeps its size.
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Sequence
from typing import Any

from dispatchcore import DispatchError
from dispatchcore.executor import LOOPBACK, free_port, rank_environment

from ._worlds import KILL_WAIT_S, SpawnedWorld

#: Why a removed rank's process is gone, as rows fetched from it report it.
REMOVED = "its rank was removed from the group (shrink)"


def _spawned(executor: Any, verb: str) -> SpawnedWorld:
    if executor.closed:
        raise DispatchError("this torchrun group is shut down")
    world = executor._world
    if not isinstance(world, SpawnedWorld):
        raise DispatchError(
            f"a group under the torchrun launcher cannot {verb}: the launcher's agent owns every process and its "
            "size is fixed at launch, and growing onto the launch's idle ranks is not supported yet. Create the "
            "groups you need at start-up (WorkerGroup(..., ranks=[...]) on the launch's ranks), or run the driver "
            "without torchrun (self-started ranks) to resize"
        )
    return world


def add_ranks(executor: Any, count: int) -> dict[str, str]:
    """Give ``count`` spare processes the next rank numbers and open them on the lane at the new size."""
    world = _spawned(executor, "grow")
    spares = [d for d in world.spares if world.processes[d].poll() is None]
    if len(spares) < count:
        raise DispatchError(
            f"growing by {count} needs {count} spare process(es); {len(spares)} left. Self-started torchrun ranks "
            f"grow onto the spare processes started with the group: create it with "
            f"spare_ranks={executor._spares_given - len(spares) + count} (each process joins the world's row "
            "transport at start-up, so none can be added later)"
        )
    n = executor.spec.world_size
    size, port = n + count, free_port(LOOPBACK)
    added = range(n, size)
    for g in added:
        d = world.take_spare()
        assert d is not None  # noqa: S101 - counted above
        executor._data_ranks.append(d)
        world.output.label(d, f"rank {g}")
        executor._envs[g] = rank_environment(g, size, master_addr=LOOPBACK, master_port=port)
    executor.resize_spec(size)
    try:
        executor.open_ranks(added, executor._start_timeout)
    except BaseException:
        executor.mark_broken(f"ranks {list(added)} did not start while the group grew")
        raise
    return {"MASTER_ADDR": LOOPBACK, "MASTER_PORT": str(port), "WORLD_SIZE": str(size)}


def remove_ranks(executor: Any, ranks: Sequence[int]) -> dict[str, str]:
    """End ``ranks``' lane links (their processes leave), wait for them, number the rest ``0..n-1``."""
    world = _spawned(executor, "shrink")
    gone = set(ranks)
    keep = [g for g in range(executor.spec.world_size) if g not in gone]
    leaving = [executor._data_ranks[g] for g in sorted(gone)]
    executor.lane.renumber(keep, REMOVED)
    for d in leaving:
        proc = world.processes.get(d)
        if proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(KILL_WAIT_S)
        world.mark_dead(d, REMOVED)
        world.kill(d)  # still there after the wait: ended now (and marked gone for row fetches)
    executor._data_ranks = [executor._data_ranks[g] for g in keep]
    for g, d in enumerate(executor._data_ranks):
        world.output.label(d, f"rank {g}")
    executor.resize_spec(len(keep))
    port = free_port(LOOPBACK)
    return {"MASTER_ADDR": LOOPBACK, "MASTER_PORT": str(port), "WORLD_SIZE": str(len(keep))}
