"""Worlds: the processes a group runs on, under torchrun or self-started.

Under torchrun the world is the launch, shared by every group of the
driver and stopped at exit; ranks other than 0 never return from their
first ``WorkerGroup(...)``: they serve every group placed on them
(``_rank_process``), then exit 0.  Outside torchrun each group starts its
own world and stops it at ``shutdown()``.  A world is a store (torch's
rendezvous and plain flags only), the driver's hub (``_hub``: each
process's authenticated link) and :meth:`World.join`; its processes move
rows over a gloo transport of their own (under the launcher the driver is
data rank 0 of it).  Calls never touch it (each group has its own lane).

A plain ``torch.distributed.init_process_group()`` in a worker under the
launcher meets just its group's ranks: while a process builds a group's
worker, ``RANK``/``WORLD_SIZE`` are the group's and ``MASTER_ADDR``/``MASTER_PORT``
name a store the driver serves for that group alone (a :class:`Meeting`;
with ``TORCHELASTIC_USE_AGENT_STORE`` every rank is its client, and the
launch's agent store would mix groups' keys).  A process keeps the
variables of the last group it built.

SIGTERM: torchrun's agent SIGTERMs every process when a rank dies.  Under
the launcher (never in self-started worlds), if SIGTERM still has its
default disposition when the first group is made on the main thread, the
driver installs a handler that raises :class:`~dispatchcore.WorkerDiedError`
naming the dead rank, so the traceback says why.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import signal
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from dispatchcore import DispatchRuntimeError, DispatchTimeoutError, WorkerDiedError
from dispatchcore.executor import LOOPBACK, use_lane_secret, wait_processes_ended

from . import _env
from ._child import STACKS_SIGNAL
from ._hub import Hub
from ._protocol import FOREVER_S, HUB_KEY, stopped_key, transport_key
from ._rank_process import Home, Services, serve_and_exit, world_bridge
from ._row_plane import RowPlane
from ._secret import forget_launch_secret, launch_secret
from ._spawn import Boot, OutputRelay, reap, spawn_process, spawn_ranks, start_store, wait_ready
from ._transport import Transport

#: Seconds ``stop`` waits for processes to leave before leaving them to their fate.
STOP_WAIT_S = 10.0
#: How long a killed rank's process is waited for (SIGKILL: a moment, unless the machine is swamped).
KILL_WAIT_S = 5.0
#: How long processes asked for their stacks get to print them before the driver raises (``show_stacks``).
STACKS_WAIT_S = 1.0
#: How long the SIGTERM report waits for a lane to see which rank died (the agent waits 30 s before SIGKILL).
SIGTERM_REPORT_WAIT_S = 5.0
#: Says which data rank is known dead and why, or ``None`` (a group's answer to the SIGTERM report).
DeadRank = Callable[[], tuple[int, str] | None]


class World:
    """A store, the driver's hub and processes that join groups: what the executor needs of either kind."""

    def __init__(self, store: dist.Store, hub: Hub) -> None:
        self.store = store
        #: The driver's end of the processes' links (``_hub``); names this world in row addresses.
        self.hub = hub
        self.identity = hub.identity
        self._lock = threading.Lock()
        self._marked: set[int] = set()
        self.stopped = False

    def join(self, data_rank: int, order: tuple[str, int, dict[str, str] | None, float, str]) -> None:
        """Tell process ``data_rank`` to serve a group's rank: ``(gid, group rank, env, death_timeout, lane)``.

        It travels on the process's authenticated link, the lane's address too: no store says where to connect.
        """
        self.hub.local.send((self.identity, data_rank), ("join", *order))

    def mark_dead(self, data_rank: int, detail: str) -> None:
        """``data_rank``'s process is gone: fetches of its rows are answered so at once (``Hub.gone``)."""
        with self._lock:
            self._marked.add(data_rank)
        self.hub.gone(data_rank, detail)

    def _announce_stop(self, ranks: list[int]) -> None:
        """Tell each process of ``ranks`` to leave."""
        self.stopped = True
        for d in ranks:
            self.hub.local.send((self.identity, d), ("stop",))


class SpawnedWorld(World):
    """Self-started ranks owned by one group: the store, the children (and spares)."""

    def __init__(
        self, world_size: int, *, start_timeout: float, transport_timeout: float, spares: int = 0, group: str = "group"
    ) -> None:
        #: Prefixes the children's output with the group and rank (see ``OutputRelay``).
        self.output = OutputRelay(group)
        master = start_store()  # only this world keeps it, so its port closes when ``stop`` lets go
        #: Prefixes every key of this world in its store (another world's ranks fetch rows under it too).
        self.prefix = f"dispatchcore/{uuid.uuid4().hex}/"
        store = dist.PrefixStore(self.prefix, master)
        hub = Hub(f"spawned:{self.prefix}", LOOPBACK)
        self._boot = Boot(master.port, self.prefix, hub.identity, hub.address[1], transport_timeout, [], 0, world_size)
        self.processes = spawn_ranks(world_size, self._boot, spares, self.output)
        #: Data ranks of started processes that host no rank yet (see ``take_spare``).
        self.spares = list(range(world_size + 1, world_size + spares + 1))
        try:
            n = len(self.processes)
            late = f"{n} self-started ranks were not all up after {start_timeout:g} s; "
            wait_ready(store, n, start_timeout, late + "raise WorkerGroup(..., start_timeout=...)", self.processes)
        except BaseException:
            hub.close()
            reap(self.processes, 0.0)
            self.output.join(1.0)
            raise
        super().__init__(store, hub)
        #: The newest generation of the processes' row transport (the driver moves no rows: not a member).
        self.generation = 0

    def show_stacks(self, data_ranks: list[int], wait: float = STACKS_WAIT_S) -> list[int]:
        """Have the live processes of ``data_ranks`` print their threads' stacks (relayed, labelled); which did."""
        shown = []
        for d in data_ranks:
            proc = self.processes.get(d)
            if STACKS_SIGNAL is not None and proc is not None and proc.poll() is None:
                with contextlib.suppress(OSError):
                    proc.send_signal(STACKS_SIGNAL)
                    shown.append(d)
        if shown:
            time.sleep(wait)  # the relay copies their lines to the driver's output meanwhile
        return shown

    def exit_reason(self, data_rank: int) -> str | None:
        """``"its process exited with code N"`` once ``data_rank``'s process has exited (the death signal)."""
        proc = self.processes.get(data_rank)
        code = None if proc is None else proc.poll()
        return None if code is None else f"its process exited with code {code}"

    def take_spare(self) -> int | None:
        """A live spare's data rank, now no longer spare; ``None`` when none is left."""
        while self.spares:
            d = self.spares.pop(0)
            if self.processes[d].poll() is None:
                return d
        return None

    def add_processes(self, count: int, world_size: int, timeout: float) -> None:
        """Start ``count`` more spares, and rebuild the row transport over every live process and them.

        Each live process joins the transport's next generation on its data thread (``_row_plane``), the new
        ones as they start; the old generations stay for rows already on their way.
        """
        with self._lock:
            live = [d for d, proc in sorted(self.processes.items()) if proc.poll() is None and d not in self._marked]
        first = max(self.processes) + 1
        added = list(range(first, first + count))
        generation = self.generation = self.generation + 1
        members = [*live, *added]
        for d in live:
            self.hub.local.send((self.identity, d), ("transport", generation, members))
        boot = dataclasses.replace(self._boot, members=members, generation=generation, world_size=world_size)
        try:
            for d in added:
                self.processes[d] = spawn_process(d, boot, {}, self.output)
            self._await_members(generation, members, timeout)
        except BaseException:  # the grow failed: what it started goes; the live processes keep their generations
            for d in added:
                if d in self.processes:
                    self.kill(d, "the grow that started it failed")
            raise
        self.spares.extend(added)

    def _await_members(self, generation: int, members: list[int], timeout: float) -> None:
        """Wait until every member is in ``generation``; fail fast on an exit or an error."""
        deadline = time.monotonic() + timeout
        waiting = list(members)
        store = self.store
        # A flag a stranger could set makes the grow go on without that process: its next call fails, no more.
        while waiting:
            for d in list(waiting):
                if store.check([transport_key(generation, d)]):
                    error = bytes(store.get(transport_key(generation, d))).decode()
                    if error:
                        raise DispatchRuntimeError(f"process {d} could not join the grown row transport: {error}")
                    waiting.remove(d)
                elif self.processes[d].poll() is not None:
                    raise DispatchRuntimeError(f"process {d} exited with code {self.processes[d].poll()} while joining")
            if time.monotonic() > deadline:
                raise DispatchTimeoutError(
                    f"processes {waiting} had not joined the grown row transport after {timeout:g} s; "
                    "raise WorkerGroup(..., start_timeout=...)"
                )
            time.sleep(0.02)

    def kill(self, data_rank: int, why: str = "it was replaced: the driver ended its process") -> None:
        """End a rank's process (a hung one being replaced), reaped at once; rows fetched from it fail (``why``)."""
        proc = self.processes.get(data_rank)
        if proc is not None and proc.poll() is None:
            proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(KILL_WAIT_S)
        self.mark_dead(data_rank, why)

    def stop(self, wait: float = STOP_WAIT_S) -> None:
        """Tell every process to leave, give them ``wait`` seconds, then end what is left."""
        if self.stopped:
            return
        self._announce_stop([d for d, proc in self.processes.items() if proc.poll() is None])
        deadline = time.monotonic() + wait
        for proc in self.processes.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(max(0.0, deadline - time.monotonic()))
        self.hub.close()
        reap(self.processes, 0.5)
        self.store = None  # type: ignore[assignment]  # let go of the store, so its port closes now
        self.output.join(1.0)  # the children are gone: their last lines are out


class LaunchWorld(World):
    """The torchrun launch seen from its driver (rank 0), which hosts worker 0 of every group."""

    def __init__(self, store: dist.Store, transport: Transport, hub: Hub) -> None:
        super().__init__(store, hub)
        self.transport = transport
        self.size = transport.size
        #: Where each group's lane listens: loopback on one node, else this host's address toward the store.
        self.lane_host = hub.address[0]
        #: Worker 0 of every group is served in this process, with what a rank process has.
        bridge = world_bridge(store, transport.loopback)
        self.services = Services(store, RowPlane(hub.local, store, transport), bridge)
        #: Each live group's answer to "which rank is dead?" (the SIGTERM report).
        self.dead_ranks: dict[str, DeadRank] = {}

    def stop(self, wait: float = STOP_WAIT_S) -> None:
        """Tell every other process to leave and wait (bounded) until each has exited."""
        if self.stopped:
            return
        others = list(range(1, self.size))
        self._announce_stop(others)
        deadline = time.monotonic() + wait
        for d in others:
            try:
                if not self._said_stopped(d, deadline):
                    continue  # dead before it could say (or silent past the bound): the agent has it
                host, pid = bytes(self.store.get(stopped_key(d))).decode().split()
            except Exception:  # noqa: BLE001, S112 - the store is gone: leave it to the agent
                continue
            if host == socket.gethostname():  # a driver ending first would make the agent call the rank failed
                wait_processes_ended([int(pid)], min(deadline, time.monotonic() + KILL_WAIT_S))
        self.hub.close()
        self.services.rows.close()
        self.services.bridge.close()
        self.transport.close()

    def _said_stopped(self, d: int, deadline: float) -> bool:
        """Whether process ``d`` wrote its ``stopped`` key by ``deadline``; a process whose link ended without it
        is dead (it writes the key before closing its link), so nobody waits the bound out for it.
        """
        key = stopped_key(d)
        while not self.store.check([key]):
            if self.hub.is_gone(d):
                return self.store.check([key])
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)
        return True

    def first_dead(self, wait: float) -> tuple[int, str] | None:
        """A rank some group's lane knows is gone, waiting up to ``wait`` seconds for one to."""
        deadline = time.monotonic() + wait
        while True:
            for ask in list(self.dead_ranks.values()):
                dead = ask()
                if dead is not None:
                    return dead
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.05)


class Meeting:
    """Where a plain ``init_process_group()`` of one launched group's ranks meets (module doc)."""

    def __init__(self, host: str, world_size: int) -> None:
        self.store: dist.TCPStore | None = start_store(host)
        self._env = {
            "WORLD_SIZE": str(world_size),
            "MASTER_ADDR": host,
            "MASTER_PORT": str(self.store.port),
            "TORCHELASTIC_USE_AGENT_STORE": "True",
        }

    def env(self, group_rank: int) -> dict[str, str]:
        """The variables ``env://`` reads, for ``group_rank`` (the launch's ``LOCAL_RANK`` stays: it picks the GPU)."""
        return {**self._env, "RANK": str(group_rank)}

    def close(self) -> None:
        """Let go of the store, so its port closes (a rank still in its rendezvous then fails)."""
        self.store = None


# -- torchrun ----------------------------------------------------------------------
_launch: LaunchWorld | None = None
_launch_lock = threading.Lock()


def _torchrun_store(start_timeout: float) -> dist.Store:
    if _env.launch_var("TORCHELASTIC_USE_AGENT_STORE", "True") != "True":
        raise DispatchRuntimeError(
            "the torchrun backend talks through torchrun's agent store, but TORCHELASTIC_USE_AGENT_STORE "
            "is not 'True' in this launch; start the driver with a plain `torchrun ...`"
        )
    host, port = _env.store_address()
    client = dist.TCPStore(host, port, None, False, timedelta(seconds=start_timeout), wait_for_workers=False)
    client.set_timeout(timedelta(seconds=FOREVER_S))
    return dist.PrefixStore(f"dispatchcore/{_env.run_id()}/", client)


def launch_world(*, start_timeout: float, transport_timeout: float) -> LaunchWorld:
    """Rank 0: the launch's world, made on first use.  Other ranks serve and exit 0 here."""
    global _launch
    rank, size = int(_env.launch_var("RANK")), int(_env.launch_var("WORLD_SIZE"))
    timeout = timedelta(seconds=max(start_timeout, transport_timeout))
    loopback = not _env.spans_nodes()
    identity = f"torchrun:{_env.run_id()}"
    if rank != 0:
        use_lane_secret(launch_secret())  # read before this process says it is up (the driver then removes it)
        home = Home(identity, rank, None)  # the hub's address: in the store once the driver opens it
        serve_and_exit(_torchrun_store(start_timeout), home, range(size), timeout, launched=True, loopback=loopback)
    with _launch_lock:
        if _launch is None:
            use_lane_secret(launch_secret())  # before this process's first door opens
            store = _torchrun_store(start_timeout)
            late = (
                f"not every torchrun rank reached its first WorkerGroup(...) within {start_timeout:g} s; every "
                "rank must run the driver script up to it (raise start_timeout if start-up is slow)"
            )
            try:
                wait_ready(store, size - 1, start_timeout, late, {})
            finally:
                forget_launch_secret()  # every process has read it (or the launch failed)
            hub = Hub(identity, _env.listen_host())
            store.set(HUB_KEY, f"{hub.address[0]} {hub.address[1]}".encode())  # type: ignore[arg-type]  # an address
            _launch = LaunchWorld(store, Transport(store, 0, range(size), timeout, loopback=loopback), hub)
            atexit.register(_launch.stop)
            _install_sigterm_report()
        return _launch


def _install_sigterm_report() -> None:
    """Under torchrun a dead rank makes the agent SIGTERM the driver: say which rank died (module doc)."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return

    def on_sigterm(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        dead = _launch.first_dead(SIGTERM_REPORT_WAIT_S) if _launch is not None else None
        if dead is None:
            raise WorkerDiedError(
                -1, "torchrun's agent stopped the driver (SIGTERM): a rank exited or torchrun was interrupted"
            )
        rank, detail = dead
        raise WorkerDiedError(rank, f"{detail}; torchrun's agent is stopping every rank")

    signal.signal(signal.SIGTERM, on_sigterm)
