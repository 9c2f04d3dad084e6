"""``TorchrunExecutor``: ranks as torch.distributed processes, on the core's lane.

The lane (calls, answers, pings, cancels, stacks, liveness) is the core's
:class:`~dispatchcore.executor.LaneExecutor`.  torchrun's own parts: how
ranks start and find their group (``_worlds``, ``_spawn``,
``_rank_process``), a self-started rank's process exit as a death signal,
lazy rows moved process to process (``_row_plane``, ``_bridge_rows``) and
weights over bridges (``_bridge``).
"""

from __future__ import annotations

import threading
import uuid
import weakref
from collections.abc import Sequence
from typing import Any

from dispatchcore import DispatchError, DispatchTimeoutError, DispatchTypeError, DispatchValueError, WorkerError
from dispatchcore.executor import (
    LOOPBACK,
    Call,
    GroupSpec,
    LaneAddress,
    LaneCallHandle,
    LaneExecutor,
    check_options,
    free_port,
    rank_environment,
)

from . import _env, _grow
from ._bridge_rows import WorldStore, reachable
from ._worlds import LaunchWorld, Meeting, SpawnedWorld, World, launch_world

#: The tensor address of every torchrun group: a source's store is reachable from every destination's process.
BRIDGE_ADDRESS = ("torchrun", "bridge")
_DEFAULTS: dict[str, Any] = {"ranks": None, "start_timeout": 120.0, "transport_timeout": 1800.0, "spare_ranks": 0}


class TorchrunExecutor(LaneExecutor):
    """Backend ``"torchrun"``: ``torchrun --nproc-per-node=N driver.py``, or self-started ranks.

    Options: ``ranks`` (world ranks hosting this group, under torchrun;
    default ``0..world_size-1``), ``start_timeout`` (seconds for the ranks to
    come up and build their workers, default 120), ``transport_timeout``
    (bound on one tensor transfer, default 1800), ``spare_ranks`` (started
    processes that can replace dead ranks; self-started worlds only).  Under
    torchrun the launch's transport is built by the first group, with its
    timeouts.
    """

    name = "torchrun"

    @classmethod
    def launch_world_size(cls) -> int | None:
        return _env.torchrun_world_size()

    def __init__(self, spec: GroupSpec) -> None:
        options = check_options(self.name, spec.options, _DEFAULTS)
        start_timeout = self._start_timeout = float(options["start_timeout"])
        transport_timeout = float(options["transport_timeout"])
        spares = options["spare_ranks"]
        if isinstance(spares, bool) or not isinstance(spares, int) or spares < 0:
            raise DispatchValueError(f"spare_ranks must be an int >= 0, got {spares!r}")
        self._spares_given = spares
        ranks = _check_ranks(options["ranks"], spec.world_size)
        self._gid = f"{spec.name}#{uuid.uuid4().hex[:8]}"
        #: A spare's rank variables, sent with its ``join`` (``replace_ranks``).
        self._envs: dict[int, dict[str, str]] = {}
        self._local: threading.Thread | None = None
        #: Calls not known to be finished: one abandoned by Ctrl-C keeps its ranks busy, so shutdown will not wait.
        self._calls: weakref.WeakSet[LaneCallHandle] = weakref.WeakSet()
        self._world: World | None = None
        #: Where a plain ``init_process_group()`` of this group meets under the launcher (``_worlds``).
        self._meeting: Meeting | None = None
        if _env.under_torchrun():
            if spares:
                raise DispatchValueError(
                    "spare_ranks needs self-started ranks: under the torchrun launcher its agent owns every "
                    "process; run the driver without torchrun to have spares"
                )
            # The launch's other ranks serve from here on; only the driver goes past this line.
            launch = launch_world(start_timeout=start_timeout, transport_timeout=transport_timeout)
            if max(ranks) >= launch.size:
                raise DispatchValueError(f"ranks {ranks} do not fit this torchrun launch of {launch.size} processes")
            # The launch is this process's only world: every group made here listens where its ranks reach.
            self.lane_host = launch.lane_host
            self._meeting = Meeting(launch.lane_host, spec.world_size)
        super().__init__(spec)  # refuses a worker class that cannot be pickled, before any process starts
        #: Where this world's store is, for consumers in other self-started worlds (``None`` under the launcher).
        self._world_store: WorldStore | None = None
        self._start_failed = False
        try:
            if _env.under_torchrun():
                self._world = launch
                #: The world rank (data rank) hosting each group rank; 0 is this process.
                self._data_ranks = list(ranks)
                launch.dead_ranks[self._gid] = self._first_dead
            else:
                self._world = SpawnedWorld(
                    spec.world_size,
                    start_timeout=start_timeout,
                    transport_timeout=transport_timeout,
                    spares=spares,
                    group=spec.name,
                )
                self._data_ranks = [g + 1 for g in range(spec.world_size)]
                self._world_store = WorldStore.of(self._world.store, self._world.prefix)
            self.open_ranks(range(spec.world_size), start_timeout)
        except BaseException:
            self._start_failed = True  # a rank may be stuck in __init__: its process is not waited for long
            self.shutdown()
            raise

    # -- the backend's part of the lane -------------------------------------------------
    def open_ranks(self, ranks: Sequence[int], timeout: float) -> None:
        """The lane's start; under the launcher, a second default group in one process is explained."""
        try:
            super().open_ranks(ranks, timeout)
        except DispatchTimeoutError as exc:
            self._show_unconnected(exc)
            raise
        except WorkerError as exc:
            if self._meeting is not None and "default process group twice" in exc.exc_message:
                exc.add_note(
                    f"under the torchrun launcher, world rank {self._data_ranks[exc.rank]}'s process already holds "
                    "torch's default process group, made by another group's rank there (a process holds one): "
                    "place this group on other ranks (ranks=[...]) or destroy that one first "
                    "(docs/process-groups.md)"
                )
            raise

    def _show_unconnected(self, exc: DispatchTimeoutError) -> None:
        """Ranks that never connected (self-started): their processes print their stacks, and ``exc`` says so."""
        world = self._world
        if exc.method is not None or not isinstance(world, SpawnedWorld):  # connected (a slow ``__init__``)
            return
        by_data = {self._data_ranks[g]: g for g in exc.ranks if g < len(self._data_ranks)}
        shown = world.show_stacks(list(by_data))
        if shown:
            exc.add_note(
                f"the processes of ranks {sorted(by_data[d] for d in shown)} are alive; each printed its threads' "
                "stacks above (lines labelled with its group and rank), to show where it is stuck"
            )

    def launch_ranks(self, ranks: Sequence[int], address: LaneAddress) -> None:
        """Tell each rank's process to join, with the lane's address, on its link (worker 0: a thread here)."""
        world = self._world
        assert world is not None  # noqa: S101 - made before any rank is opened
        world.hub.watch(self._gid, self._silent)
        for g in ranks:
            d = self._data_ranks[g]
            if self._meeting is not None:
                self._envs[g] = self._meeting.env(g)
            if d == 0 and isinstance(world, LaunchWorld):
                _env.present_group(self._envs.pop(g))  # here, before the serving thread starts
                self._local = threading.Thread(
                    target=world.services.serve_group,
                    args=(self._gid, g, self.spec.death_timeout, address.encode()),
                    name=f"dispatchcore-{self.spec.name}-rank{g}",
                    daemon=True,
                )
                self._local.start()
            else:
                world.join(d, (self._gid, g, self._envs.pop(g, None), self.spec.death_timeout, address.encode()))

    def rank_dead(self, rank: int) -> str | None:
        """A self-started rank's process exit (under the launcher its agent owns the processes: no signal)."""
        world = self._world
        return world.exit_reason(self._data_ranks[rank]) if isinstance(world, SpawnedWorld) else None

    def rank_gone(self, rank: int, reason: str) -> None:
        """Tell the world's hub: fetches waiting on the rank's process are answered at once (``_hub``)."""
        if self._world is not None and not self.closed:
            self._world.mark_dead(self._data_ranks[rank], reason)

    def _silent(self, d: int) -> str | None:
        """Why process ``d``'s rank here is gone, by the lane's rule (the hub asks while a fetch waits on it)."""
        if self.closed or d not in self._data_ranks:
            return None
        return self.lane.silent(self._data_ranks.index(d), self.spec.death_timeout)

    def _first_dead(self) -> tuple[int, str] | None:
        """A rank of this group the lane knows is gone (world rank, why); only reads: runs in a signal handler."""
        for g in range(self.spec.world_size):
            reason = self.lane.ended(g)
            if reason is not None:
                return self._data_ranks[g], reason
        return None

    def stop_ranks(self) -> None:
        """A self-started world stops with its group; the launch's processes go on serving other groups."""
        world = self._world
        if world is not None:
            world.hub.unwatch(self._gid)
        if isinstance(world, SpawnedWorld):
            world.stop(wait=0.5 if self._stuck else 10.0)
        elif isinstance(world, LaunchWorld):
            world.dead_ranks.pop(self._gid, None)
            if self._meeting is not None:
                self._meeting.close()
            if self._local is not None:
                self._local.join(2.0)

    def shutdown(self) -> None:
        # Seen before the lane closes (which ends every waiting call): a call abandoned by Ctrl-C
        # keeps its ranks busy, so stopping them will not wait.
        self._stuck = (
            self._start_failed or self.broken is not None or any(not call.settled() for call in list(self._calls))
        )
        super().shutdown()

    # -- calls ------------------------------------------------------------------------
    def submit(self, call: Call) -> LaneCallHandle:
        """A call (the core's row reads too: on the lane's beside thread), kept to see whether it is still running."""
        handle = super().submit(call)
        self._calls.add(handle)
        return handle

    # -- replacing dead ranks -------------------------------------------------------
    def replace_ranks(self, ranks: Sequence[int]) -> dict[str, str]:
        """Hand ``ranks`` to spare processes, which already belong to the world's transport (old ones are killed)."""
        if self.closed:
            raise DispatchError("this torchrun group is shut down")
        world = self._world
        if not isinstance(world, SpawnedWorld):
            raise DispatchError(
                "ranks started by the torchrun launcher cannot be replaced: its agent owns every process (its "
                "--max-restarts restarts the whole launch). The driver exits naming the dead rank; for in-place "
                "replacement run the driver without torchrun (self-started ranks) with spare_ranks=k"
            )
        left = len(world.spares)
        if left < len(ranks):
            raise DispatchError(
                f"{left} spare{'' if left == 1 else 's'} left: create the group with "
                f"spare_ranks={self._spares_given - left + len(ranks)} (self-started torchrun ranks are replaced "
                "from the spare processes started with the group)"
            )
        port = free_port(LOOPBACK)
        for g in ranks:
            # The old process's end, if the lane reports it late, must never be taken for the spare's.
            with self.lane.membership:
                self.lane.retire([g], f"rank {g} was replaced")
                old, d = self._data_ranks[g], world.take_spare()
                if d is None:
                    raise DispatchError(f"every spare process is gone; cannot replace rank {g}")
                self._data_ranks[g] = d
            world.kill(old)
            world.output.label(d, f"rank {g}")  # its output says which rank it now is
            self._envs[g] = rank_environment(g, self.spec.world_size, master_addr=LOOPBACK, master_port=port)
        self.open_ranks(ranks, self._start_timeout)
        return {"MASTER_ADDR": LOOPBACK, "MASTER_PORT": str(port)}

    def can_replace_ranks(self) -> bool:
        """Self-started worlds with a spare left (the launcher's agent owns its processes)."""
        world = self._world
        return not self.closed and isinstance(world, SpawnedWorld) and bool(world.spares)

    # -- growing and shrinking (``_grow``) ----------------------------------------------
    def add_ranks(self, count: int) -> dict[str, str]:
        """Spare processes take the new ranks (self-started worlds; see ``_grow``)."""
        return _grow.add_ranks(self, count)

    def remove_ranks(self, ranks: Sequence[int]) -> dict[str, str]:
        """The removed ranks' processes leave; the rest are renumbered (see ``_grow``)."""
        return _grow.remove_ranks(self, ranks)

    # -- lazy results: rows fetched process to process ----------------------------------
    def row_address(self, rank: int) -> Any:
        """``(world, data rank, world store)``: the process keeping rank ``rank``'s rows, and how to reach it."""
        assert self._world is not None  # noqa: S101 - calls come after the start
        return (self._world.identity, self._data_ranks[rank], self._world_store)

    def can_fetch_rows(self, address: Any) -> bool:
        """Rows of this world move over its transport; another running self-started world's, over bridges."""
        if not (isinstance(address, tuple) and len(address) == 3) or self._world is None:
            return False
        if address[0] == self._world.identity:
            return True
        return isinstance(self._world, SpawnedWorld) and not self.closed and reachable(address)

    # -- weight transfers: bridges between the ranks involved (``_bridge``) ----------------
    def tensor_address(self) -> Any:
        """Every torchrun group's ranks can bridge to every other's: the launch's, or self-started on this machine."""
        return BRIDGE_ADDRESS

    def can_receive_tensors(self, address: Any) -> bool:
        return bool(address == BRIDGE_ADDRESS)


def _check_ranks(ranks: Any, world_size: int) -> list[int]:
    if ranks is None:
        return list(range(world_size))
    if isinstance(ranks, (str, bytes)) or not hasattr(ranks, "__iter__"):
        raise DispatchTypeError(f"ranks must be a list of ints, got {ranks!r}")
    out = list(ranks)
    if any(isinstance(r, bool) or not isinstance(r, int) or r < 0 for r in out) or len(set(out)) != len(out):
        raise DispatchValueError(f"ranks must be distinct ints >= 0, got {ranks!r}")
    if len(out) != world_size:
        raise DispatchValueError(
            f"ranks {out} name {len(out)} processes but world_size is {world_size}; pass world_size=len(ranks)"
        )
    return out
