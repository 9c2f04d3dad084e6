"""A process of a torchrun world that is not the driver: it serves each group placed on it on the core's lane.

Its main thread pops the driver's ``join`` messages (``_protocol``); each
group's rank is a :class:`~dispatchcore.executor.LaneRank`.  A self-started
process hosts one group, served on its main thread (glibc's main arena
keeps the freed memory, see ``keep_freed_memory``), and leaves as soon as
that group's lane ends, even mid-call; a launch's process serves each group
on a thread of its own.  Beside them run the process's
:class:`~._row_plane.RowPlane` (lazy rows) and :class:`~._bridge.Bridge`
(weights).
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from collections.abc import Callable

import torch.distributed as dist

from dispatchcore.executor import LaneRank, WorkerHost, keep_freed_memory

from ._bridge import Bridge, BridgeLink
from ._collective import collective_link
from ._control import StoreDirectory
from ._env import set_local_device
from ._protocol import join_key, lane_key, pop, stopped_key
from ._row_plane import RowPlane
from ._transport import Transport

#: After ``stop``, how long a rank still inside a call is waited for before the process leaves anyway.
STOP_GRACE_S = 5.0


class Services:
    """What every rank of a process shares: the store, the row plane and the weight bridge."""

    def __init__(self, store: dist.Store, rows: RowPlane, bridge: Bridge) -> None:
        self.store = store
        self.rows = rows
        self.bridge = bridge

    def serve_group(
        self, gid: str, group_rank: int, death_timeout: float, on_driver_gone: Callable[[], None] | None = None
    ) -> None:
        """Serve rank ``group_rank`` of group ``gid`` on this thread until the driver ends the group's lane.

        ``on_driver_gone()``: run on the lane's control thread when the lane ends, even mid-call.
        """
        set_local_device()

        def prepare(host: WorkerHost) -> None:
            self.rows.equip(host, death_timeout)
            host.tensor_link = BridgeLink(self.bridge, death_timeout)
            host.collective = collective_link(self.store, gid)

        rank = LaneRank(group_rank, prepare=prepare, on_driver_gone=on_driver_gone)
        try:
            rank.serve(StoreDirectory(self.store, lane_key(gid)).lookup())
        finally:
            if rank.host is not None:
                rank.host.close()


def serve_process(store: dist.Store, transport: Transport, *, threads: bool) -> bool:
    """Join the groups the driver places here until it says ``stop``; whether every rank ended in time.

    ``threads``: serve each group on a thread of its own (else on this one, a group at a time).
    """
    keep_freed_memory()  # this process is the ranks' own (the driver's is the user's: left alone)
    services = Services(store, RowPlane(store, transport), Bridge(store))
    queue = store.clone()  # type: ignore[attr-defined]  # a blocking pop of its own; Store.clone is missing from the stubs
    groups: list[threading.Thread] = []
    try:
        while True:
            try:
                message = pop(queue, join_key(transport.rank))
            except Exception:  # noqa: BLE001 - the store is gone: so is the driver
                break
            if message[0] == "stop":
                break
            _, gid, group_rank, env, death_timeout = message
            if env:  # a spare taking over a rank: its rank variables come now
                os.environ.update(env)
            if not threads:
                services.serve_group(gid, group_rank, death_timeout, on_driver_gone=_leave)
                continue
            thread = threading.Thread(
                target=services.serve_group,
                args=(gid, group_rank, death_timeout),
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
            store.set(stopped_key(transport.rank), f"{socket.gethostname()} {os.getpid()}".encode())  # type: ignore[arg-type]
        except Exception:  # noqa: BLE001, S110 - the driver is gone already
            pass
    return not any(thread.is_alive() for thread in groups)


def _leave() -> None:
    """A self-started process's group is over (or its driver is gone): nothing is left to do here."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
