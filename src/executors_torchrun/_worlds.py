"""Worlds: the processes a group runs on, under torchrun or self-started.

Under torchrun the world is the launch: one per process, shared by every
group the driver creates, stopped when the driver exits (atexit, which also
runs when an exception escapes the driver).  Ranks other than 0 never
return from their first ``WorkerGroup(...)``: they serve until told to stop
and exit 0.  Outside torchrun each group starts its own world and stops it
at ``shutdown()``.

The launch's hub is the one piece of process-wide state, and it carries no
group's settings: every call's liveness bound is its own group's
``death_timeout`` (see ``_hub``).  Its transport is built once, from the
first group's ``start_timeout`` and ``transport_timeout``.

SIGTERM: under the torchrun launcher only (never in self-started worlds),
when the first group is made on the driver's main thread and SIGTERM still
has its default disposition, the driver installs a handler.  torchrun's
elastic agent SIGTERMs every process when one rank dies; the handler
restores the default disposition and raises
:class:`~dispatchcore.WorkerDiedError` naming the dead rank (waiting up to
1 s for the hub to see which), so the driver's traceback says why instead of
just ending.  A program that installed its own handler first keeps it.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from datetime import timedelta
from typing import Any, NoReturn

import torch.distributed as dist

from dispatchcore import WorkerDiedError
from dispatchcore.executor import LOOPBACK, address_toward

from . import _env
from ._bridge import Bridge
from ._hub import Hub
from ._protocol import FOREVER_S, READY_KEY
from ._row_plane import RowPlane
from ._server import Server
from ._spawn import OutputRelay, reap, spawn_ranks, start_store, wait_ready
from ._transport import Transport

#: Seconds ``stop`` waits for ranks to acknowledge before leaving them to their fate.
STOP_WAIT_S = 10.0
#: How long a killed rank's process is waited for (SIGKILL: a moment, unless the machine is swamped).
KILL_WAIT_S = 5.0


class SpawnedWorld:
    """Self-started ranks owned by one group: store, children, hub."""

    def __init__(
        self, world_size: int, *, start_timeout: float, transport_timeout: float, spares: int = 0, group: str = "group"
    ) -> None:
        self.torchrun = False
        #: Prefixes the children's output with the group and rank (see ``OutputRelay``).
        self.output = OutputRelay(group)
        # Only the hub keeps the store, so it (and its port) closes when ``stop`` releases it.
        master = start_store()
        prefix = f"dispatchcore/{uuid.uuid4().hex}/"
        #: Names this world in row addresses: only its own processes can move rows to one another.
        self.identity = f"spawned:{prefix}"
        #: Prefixes every key of this world in its store (another world's ranks fetch rows under it too).
        self.prefix = prefix
        store = dist.PrefixStore(prefix, master)
        self.processes = spawn_ranks(world_size, master.port, prefix, transport_timeout, spares, self.output)
        #: Data ranks of started processes that host no rank yet (see ``take_spare``).
        self.spares = list(range(world_size + 1, world_size + spares + 1))
        try:
            wait_ready(store, self.processes, start_timeout)
            transport = _connect(store, 0, world_size + spares + 1, start_timeout, transport_timeout, loopback=True)
        except BaseException:
            reap(self.processes, 0.0)
            self.output.join(1.0)
            raise
        try:
            self.hub = Hub(store, transport, processes=self.processes, host=LOOPBACK, connect_timeout=start_timeout)
        except BaseException:
            reap(self.processes, 0.0)
            self.output.join(1.0)
            raise
        self._stopped = False

    def data_rank(self, group_rank: int) -> int:
        return group_rank + 1

    def take_spare(self) -> int | None:
        """A live spare's data rank, now no longer spare; ``None`` when none is left."""
        while self.spares:
            d = self.spares.pop(0)
            if self.processes[d].poll() is None and self.hub.dead_reason(d) is None:
                return d
        return None

    def assign(self, data_rank: int, group_rank: int) -> None:
        """Record that ``data_rank``'s process now hosts ``group_rank`` (its output says so)."""
        self.output.label(data_rank, f"rank {group_rank}")

    def kill(self, data_rank: int) -> None:
        """End a rank's process (a hung one being replaced); the hub counts it gone at once (``Hub.retire``).

        Reaped here too (SIGKILL ends it at once), so that a ``stop`` soon
        after knows it has exited and does not wait for it to answer.
        """
        proc = self.processes.get(data_rank)
        if proc is not None and proc.poll() is None:
            proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(KILL_WAIT_S)
        if self.hub.dead_reason(data_rank) is None:
            self.hub.retire(data_rank, "it was replaced: the driver ended its process")

    def stop(self, wait: float = STOP_WAIT_S) -> None:
        if self._stopped:
            return
        self._stopped = True
        # Children are reaped before the hub drops its transport: a canary receive
        # still waiting on a live child when the gloo group goes aborts the driver at exit.
        self.hub.stop(wait, on_stopped=lambda: reap(self.processes, min(wait, 2.0)))
        self.hub.release_store()
        self.output.join(1.0)  # the children are gone: their last lines are out


def _connect(
    store: dist.Store, rank: int, size: int, start_timeout: float, transport_timeout: float, *, loopback: bool = False
) -> Transport:
    """The transport of this process; ``loopback`` only for a self-started (one-machine) world."""
    timeout = timedelta(seconds=max(start_timeout, transport_timeout))
    return Transport(store, rank, size, timeout, loopback=loopback)


# -- torchrun ----------------------------------------------------------------------
_torchrun_hub: Hub | None = None
#: Weight transfers of worker 0 (in the driver) under the launcher.
_torchrun_bridge: Bridge | None = None
_torchrun_lock = threading.Lock()


def _torchrun_store(start_timeout: float) -> dist.Store:
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "True") != "True":
        raise RuntimeError(
            "the torchrun backend talks through torchrun's agent store, but TORCHELASTIC_USE_AGENT_STORE "
            "is not 'True' in this launch; start the driver with a plain `torchrun ...`"
        )
    host, port = _env.store_address()
    client = dist.TCPStore(host, port, None, False, timedelta(seconds=start_timeout), wait_for_workers=False)
    client.set_timeout(timedelta(seconds=FOREVER_S))
    return dist.PrefixStore(f"dispatchcore/{_env.run_id()}/", client)


def torchrun_hub(*, start_timeout: float, transport_timeout: float) -> Hub:
    """Rank 0: the launch's hub, made on first use.  Other ranks serve and exit 0 here."""
    global _torchrun_hub, _torchrun_bridge
    rank, size = _env.torchrun_rank(), int(os.environ["WORLD_SIZE"])
    if rank != 0:
        serve_and_exit(start_timeout, transport_timeout)
    with _torchrun_lock:
        if _torchrun_hub is None:
            store = _torchrun_store(start_timeout)
            _wait_count(store, size - 1, start_timeout)
            transport = _connect(store, 0, size, start_timeout, transport_timeout)
            host = address_toward(*_env.store_address())
            _torchrun_hub = Hub(store, transport, processes=None, host=host, connect_timeout=start_timeout)
            _torchrun_hub.rows = RowPlane(store, transport)  # worker 0 of every group lives here
            _torchrun_bridge = Bridge(store)
            atexit.register(_stop_torchrun_world)
            _install_sigterm_report()
        return _torchrun_hub


def torchrun_bridge() -> Bridge | None:
    """The driver's bridge under the launcher (worker 0's weight transfers); ``None`` before the first group."""
    return _torchrun_bridge


def torchrun_identity() -> str:
    """Names the launch's world in row addresses (every group of the launch shares its processes)."""
    return f"torchrun:{_env.run_id()}"


def serve_and_exit(start_timeout: float, transport_timeout: float) -> NoReturn:
    """A rank other than 0: serve every group the driver makes, then exit 0."""
    store = _torchrun_store(start_timeout)
    store.add(READY_KEY, 1)
    transport = _connect(store, _env.torchrun_rank(), int(os.environ["WORLD_SIZE"]), start_timeout, transport_timeout)
    Server(store, transport).serve()
    sys.stdout.flush()
    sys.stderr.flush()
    sys.exit(0)


def _wait_count(store: dist.Store, count: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while int(store.add(READY_KEY, 0)) < count:
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"not every torchrun rank reached its first WorkerGroup(...) within {timeout:g} s; every "
                "rank must run the driver script up to it (raise start_timeout if start-up is slow)"
            )
        time.sleep(0.02)


def _stop_torchrun_world() -> None:
    hub = _torchrun_hub
    if hub is not None:
        hub.stop(STOP_WAIT_S)
    if _torchrun_bridge is not None:
        _torchrun_bridge.close()


def _install_sigterm_report() -> None:
    """Under torchrun a dead rank makes the agent SIGTERM the driver: say which rank died (module doc)."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return

    def on_sigterm(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        hub = _torchrun_hub
        dead = hub.wait_for_dead(1.0) if hub is not None else None
        if dead is None:
            raise WorkerDiedError(
                -1, "torchrun's agent stopped the driver (SIGTERM): a rank exited or torchrun was interrupted"
            )
        rank, detail = dead
        raise WorkerDiedError(rank, f"{detail}; torchrun's agent is stopping every rank")

    signal.signal(signal.SIGTERM, on_sigterm)
