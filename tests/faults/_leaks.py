"""What a fault may leave behind in the driver: threads, fds, child processes, shm.

Read with no extra dependency (``/proc`` and ``/dev/shm``), so the suite runs
on the same install as the rest of the tests.  Ray actors and placement
groups are counted through Ray's own state API when Ray is running.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


def _children(pid: int) -> set[int]:
    """Live descendant pids of ``pid`` (zombies excluded), read from /proc."""
    parents: dict[int, int] = {}
    states: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        rest = stat[stat.rfind(")") + 2 :].split()
        states[int(entry)] = rest[0]
        parents[int(entry)] = int(rest[1])
    found: set[int] = set()
    frontier = [pid]
    while frontier:
        p = frontier.pop()
        for child, parent in parents.items():
            if parent == p and child not in found:
                found.add(child)
                frontier.append(child)
    return {c for c in found if states.get(c) != "Z"}


#: Public name: every live process ``pid`` started, directly or not.
descendants = _children


def _ray_counts() -> tuple[int, int]:
    """Alive actors and live placement groups of the running Ray (0, 0 without one).

    Read from the GCS tables: Ray's state API (``ray.util.state``) needs the
    dashboard, which the tests start Ray without.
    """
    try:
        import ray
    except ImportError:
        return 0, 0
    if not ray.is_initialized():
        return 0, 0
    from ray._private import state as gcs
    from ray.util import placement_group_table

    actors = sum(1 for a in gcs.actors().values() if a.get("State") == "ALIVE")
    groups = sum(1 for g in placement_group_table().values() if g.get("state") != "REMOVED")
    return actors, groups


def _fd_targets() -> dict[str, str]:
    targets = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            targets[fd] = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # closed meanwhile (the listing's own descriptor, for one)
            continue
    return targets


@dataclass(frozen=True)
class Snapshot:
    """Counts of everything a group could leak, taken in the driver."""

    threads: frozenset[str]
    fds: int
    children: frozenset[int]
    shm: frozenset[str]
    ray_actors: int = 0
    ray_placement_groups: int = 0
    #: ``fd -> what it points at``, to say what a leaked descriptor is.
    fd_targets: dict[str, str] = field(default_factory=dict, compare=False)
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def take(cls, *, ray: bool = False) -> Snapshot:
        actors, groups = _ray_counts() if ray else (0, 0)
        targets = _fd_targets()
        return cls(
            threads=frozenset(f"{t.name}#{t.ident}" for t in threading.enumerate()),
            fds=len(targets),
            children=frozenset(_children(os.getpid())),
            shm=frozenset(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else frozenset(),
            ray_actors=actors,
            ray_placement_groups=groups,
            fd_targets=targets,
        )

    def leaks_since(self, before: Snapshot) -> dict[str, Any]:
        """What this snapshot holds that ``before`` did not (empty when nothing leaked)."""
        leaks: dict[str, Any] = {}
        threads = sorted(t.split("#")[0] for t in self.threads - before.threads)
        if threads:
            leaks["threads"] = threads
        if self.fds > before.fds:
            leaks["fds"] = self.fds - before.fds
            new = sorted({t for fd, t in self.fd_targets.items() if before.fd_targets.get(fd) != t})
            if new:
                leaks["fd_targets"] = new
        children = sorted(self.children - before.children)
        if children:
            leaks["processes"] = children
        shm = sorted(self.shm - before.shm)
        if shm:
            leaks["shm"] = shm
        if self.ray_actors > before.ray_actors:
            leaks["ray_actors"] = self.ray_actors - before.ray_actors
        if self.ray_placement_groups > before.ray_placement_groups:
            leaks["ray_placement_groups"] = self.ray_placement_groups - before.ray_placement_groups
        return leaks


def settle(before: Snapshot, *, ray: bool = False, within: float = 10.0) -> dict[str, Any]:
    """Leaks since ``before``, re-checked until none remain or ``within`` seconds pass.

    Processes and actors take a moment to be reaped after ``shutdown()``
    returns; a real leak is one that is still there after that.
    """
    deadline = time.monotonic() + within
    while True:
        leaks = Snapshot.take(ray=ray).leaks_since(before)
        if not leaks or time.monotonic() >= deadline:
            return leaks
        time.sleep(0.2)


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    """(seconds, the exception ``fn`` raised or its value)."""
    start = time.monotonic()
    try:
        value = fn()
    except BaseException as exc:  # noqa: BLE001 - the suite inspects what was raised
        value = exc
    return time.monotonic() - start, value
