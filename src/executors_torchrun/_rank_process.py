"""A process of a torchrun world that is not the driver: it serves each group placed on it on the core's lane.

One process hosts one rank per group the driver places on it (actor,
critic, ...).  Its main thread pops the driver's ``join`` messages from the
store (``_protocol``); each group's rank is a
:class:`~dispatchcore.executor.LaneRank`, whose serving thread is that
worker's method thread (its ``LOCAL_RANK`` GPU made current there).  A
self-started process hosts one group: it serves it on its main thread
(glibc's main arena, where the kept freed memory stays, see
``keep_freed_memory``) and leaves as soon as that group's lane ends, even
mid-call.  A launch's process hosts every group the driver
makes, each on a thread of its own.  Beside them, the process's :class:`~._row_plane.RowPlane` serves
the lazy rows it keeps and fetches the ones its workers' arguments name,
and its :class:`~._bridge.Bridge` moves weights.  On ``stop`` the process
leaves: a rank still inside a call is given :data:`STOP_GRACE_S` to end.
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
from ._protocol import decode, join_key, lane_key, stopped_key
from ._row_plane import RowPlane
from ._transport import Transport

#: What a rank runs when its driver's lane ends.
Leave = Callable[[], None]
#: After ``stop``, how long a rank still inside a call is waited for before the process leaves anyway.
STOP_GRACE_S = 5.0


class Services:
    """What every rank of a process shares: the store, the row plane and the weight bridge."""

    def __init__(self, store: dist.Store, rows: RowPlane, bridge: Bridge) -> None:
        self.store = store
        self.rows = rows
        self.bridge = bridge

    def serve_group(
        self,
        gid: str,
        group_rank: int,
        death_timeout: float,
        isolate: bool,
        on_driver_gone: Callable[[], None] | None = None,
    ) -> None:
        """Serve rank ``group_rank`` of group ``gid`` on this thread until the driver ends the group's lane.

        ``on_driver_gone()``: run on the lane's control thread when the lane ends, even mid-call.
        """
        set_local_device()

        def prepare(host: WorkerHost) -> None:
            RowPlane.equip(host, self.rows, death_timeout=death_timeout, isolate=isolate)
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
                message = decode(queue.queue_pop(join_key(transport.rank), True))
            except dist.QueueEmptyError:  # seen rarely on a blocking pop: just wait again
                continue
            except Exception:  # noqa: BLE001 - the store is gone: so is the driver
                break
            if message[0] == "stop":
                break
            _, gid, group_rank, env, death_timeout, isolate = message
            if env:  # a spare taking over a rank: its rank variables come now
                os.environ.update(env)
            if not threads:
                services.serve_group(gid, group_rank, death_timeout, isolate, on_driver_gone=_leave)
                continue
            thread = threading.Thread(
                target=services.serve_group,
                args=(gid, group_rank, death_timeout, isolate),
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
