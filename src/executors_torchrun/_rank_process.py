"""A process of a torchrun world that is not the driver: it serves each group placed on it on the core's lane.

Its main thread takes the driver's ``join`` messages (on its link, ``_post``); each
group's rank is a :class:`~dispatchcore.executor.LaneRank`.  A self-started
process hosts one group, served on its main thread (glibc's main arena
keeps the freed memory, see ``keep_freed_memory``), and leaves as soon as
that group's lane ends, even mid-call; a launch's process serves each group
on a thread of its own.  On the main thread a cancel also interrupts a
blocking system call (``install_cancel_signal``).  Beside them run the process's
:class:`~._row_plane.RowPlane` (lazy rows) and :class:`~dispatchcore.executor.TensorBridge`
(weights).
"""

from __future__ import annotations

import os
import queue
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, NoReturn

import torch.distributed as dist

from dispatchcore.executor import (
    LOOPBACK,
    LaneRank,
    StoreCollective,
    TensorBridge,
    TensorBridgeLink,
    WorkerHost,
    address_toward,
    install_cancel_signal,
    keep_freed_memory,
    lane_secret,
)

from ._env import present_group, set_local_device
from ._post import connect_post
from ._protocol import HUB_KEY, READY_KEY, home_of, stopped_key, transport_key
from ._row_plane import RowPlane
from ._transport import Transport

#: After ``stop``, how long a rank still inside a call is waited for before the process leaves anyway.
STOP_GRACE_S = 5.0


@dataclass
class Services:
    """What every rank of a process shares: the store, the row plane and the weight bridge."""

    store: dist.Store
    rows: RowPlane
    bridge: TensorBridge

    def serve_group(
        self,
        gid: str,
        group_rank: int,
        death_timeout: float,
        lane: str,
        on_driver_gone: Callable[[], None] | None = None,
    ) -> None:
        """Serve rank ``group_rank`` of group ``gid`` on the lane at ``lane`` until it ends, then ``on_driver_gone``."""
        set_local_device()
        install_cancel_signal()  # where this is the main thread (self-started): a cancel ends a blocking sleep too

        def prepare(host: WorkerHost) -> None:
            self.rows.equip(host, death_timeout)
            host.tensor_link = TensorBridgeLink(self.bridge, death_timeout)
            # dispatchcore.collective: the world's store every process reaches, never the default group
            host.collective = StoreCollective("torchrun", store=dist.PrefixStore(f"collective/{gid}/", self.store))

        rank = LaneRank(group_rank, prepare=prepare, on_driver_gone=on_driver_gone)
        try:
            rank.serve(lane, secret=lane_secret())
        finally:
            if rank.host is not None:
                rank.host.close()


@dataclass(frozen=True)
class Home:
    """Where a process belongs: its world's identity, its data rank, the driver's hub (``_hub``)."""

    world: str
    rank: int
    #: ``None``: read it from the store (``hub``: a plain address; only the secret admits a process).
    hub: tuple[str, int] | None

    def hub_address(self, store: dist.Store) -> tuple[str, int]:
        if self.hub is not None:
            return self.hub
        host, port = bytes(store.get(HUB_KEY)).decode().split()
        return host, int(port)


def serve_and_exit(
    store: dist.Store,
    home: Home,
    members: Sequence[int],
    timeout: timedelta,
    *,
    launched: bool,
    loopback: bool,
    generation: int = 0,
) -> NoReturn:
    """Say this process is up, join the world's transport, serve until told to stop, then exit 0.

    A launch's process serves each group on a thread of its own; a self-started one, one group on this thread.
    A process added to a running world joins its transport's newest ``generation`` over ``members``.
    """
    store.add(READY_KEY, 1)
    transport = Transport(store, home.rank, members, timeout, loopback=loopback, generation=generation)
    if generation:  # added to a running world: the driver waits for this
        store.set(transport_key(generation, home.rank), b"")  # type: ignore[arg-type]  # the binding takes bytes
    ended = serve_process(store, home, transport, threads=launched)
    sys.stdout.flush()
    sys.stderr.flush()
    if launched and ended:
        sys.exit(0)
    os._exit(0)  # self-started, or a rank is stuck in a call the driver no longer waits for


def serve_process(store: dist.Store, home: Home, transport: Transport, *, threads: bool) -> bool:
    """Join the groups the driver places here (each on a thread of its own with ``threads``) until ``stop``.

    The driver's ``join`` and ``stop`` arrive on this process's link to it; its end is a ``stop`` too.
    Returns whether every rank ended in time.
    """
    keep_freed_memory()  # this process is the ranks' own (the driver's is the user's: left alone)
    orders: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
    hub = home.hub_address(store)
    post = connect_post(hub, (home.world, home.rank), lane_secret(), 60.0, lambda: orders.put(("stop",)))
    driver = (home.world, 0)
    for kind in ("join", "stop"):
        post.on(kind, lambda sender, message: orders.put(message) if sender == driver else None)
    services = Services(store, RowPlane(post, store, transport), world_bridge(store, transport.loopback))
    post.start()
    groups: list[threading.Thread] = []
    try:
        while (message := orders.get())[0] != "stop":
            _, gid, group_rank, env, death_timeout, lane = message
            if env:  # its rank variables: a spare's taking over a rank, a launch's for the group (``_worlds``)
                present_group(env)
            if not threads:
                services.serve_group(gid, group_rank, death_timeout, lane, on_driver_gone=_leave)
                continue
            thread = threading.Thread(
                target=services.serve_group,
                args=(gid, group_rank, death_timeout, lane),
                name=f"dispatchcore-{gid}-rank{group_rank}",
                daemon=True,
            )
            thread.start()
            groups.append(thread)
    finally:
        deadline = time.monotonic() + STOP_GRACE_S
        for thread in groups:
            thread.join(max(0.0, deadline - time.monotonic()))
        services.rows.close()
        services.bridge.close()
        transport.close()
        try:
            store.set(stopped_key(home.rank), f"{socket.gethostname()} {os.getpid()}".encode())  # type: ignore[arg-type]
        except Exception:  # noqa: BLE001, S110 - the driver is gone already
            pass
        post.close()
    return not any(thread.is_alive() for thread in groups)


def world_bridge(store: dist.Store, loopback: bool) -> TensorBridge:
    """This process's weight bridge: pairs meet on the world's store; its door listens where the world's groups do."""
    host, port = home_of(store)
    return TensorBridge(lane_secret(), meet=(host, port), host=LOOPBACK if loopback else address_toward(host, port))


def _leave() -> None:
    """A self-started process's group is over (or its driver is gone): nothing is left to do here."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
