"""The loop every rank but the hub runs: serve the hub's commands for every group.

One process hosts one worker per group placed on it (actor, critic, ...),
each built by :class:`~dispatchcore.WorkerHost` so a raising worker becomes a
status, never a crash: every command that expects an answer gets one, and
the group stays in step.  Beside the loop, the process's
:class:`~._row_plane.RowPlane` serves the lazy results it keeps to other
ranks and fetches the ones its workers' arguments name.  The loop returns
on ``stop``; the caller exits 0.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from typing import Any

import torch.distributed as dist

from dispatchcore.executor import Instructions, LaneLink, RemoteFailure, WorkerHost, keep_freed_memory

from ._bridge import Bridge, BridgeLink
from ._collective import collective_link
from ._control import connect_to_hub
from ._env import set_local_device
from ._protocol import STOPPING_KEY, decode, encode, heartbeat_key
from ._row_plane import RowPlane
from ._transport import TagCounter, Transport
from ._wire import batch_layout, pack, unpack

HUB = 0
#: Seconds between heartbeats (the hub's monitor reads them under torchrun).
HEARTBEAT_S = 1.0
#: After the hub said it is stopping, a rank stuck in a call exits this much later.
STOP_GRACE_S = 5.0


class Server:
    """One non-hub rank: commands in and statuses out on its control link, tensors point to point."""

    def __init__(self, store: dist.Store, transport: Transport) -> None:
        self._store = store
        self._transport = transport
        self._rank = transport.rank
        self._hosts: dict[str, WorkerHost] = {}
        self._hub_tags = TagCounter(0)
        self._done = threading.Event()
        self._rows: RowPlane | None = None
        self._link: LaneLink | None = None
        #: Weight transfers to and from this process's workers (bridges built on demand).
        self._bridge = Bridge(store)

    def serve(self) -> None:
        """Run commands until ``stop``; then release the workers and the transport."""
        set_local_device()
        keep_freed_memory()  # this process is the rank's own (the driver's is the user's: left alone)
        threading.Thread(target=self._heartbeat, name="dispatchcore-heartbeat", daemon=True).start()
        self._rows = RowPlane(self._store, self._transport)
        self._link = link = connect_to_hub(self._store, self._rank)
        try:
            while True:
                try:
                    message = decode(link.recv())
                except ConnectionError:  # the driver is gone: nothing more will come
                    break
                kind = message[0]
                if kind == "stop":
                    break
                if kind == "call":
                    self._call(*message[1:])
                elif kind == "start":
                    self._start(*message[1:])
                elif kind == "close":
                    host = self._hosts.pop(message[1], None)
                    if host is not None:
                        host.close()
        finally:
            self._done.set()
            self._finish()

    # -- commands ---------------------------------------------------------------
    def _start(
        self,
        cid: int,
        gid: str,
        rank: int,
        size: int,
        header: Any,
        first: int,
        env: dict[str, str] | None = None,
        death_timeout: float = 60.0,
        isolate: bool = True,
    ) -> None:
        if env:  # a spare taking over a rank: its rank variables come now
            os.environ.update(env)
        try:
            worker_cls, args, kwargs = self._receive(header, first)
        except BaseException as exc:  # noqa: BLE001 - reported as the group's failure
            self._reply(cid, False, RemoteFailure.capture(rank, "__init__", exc))
            return
        host = WorkerHost(worker_cls, rank, size, args, kwargs)
        RowPlane.equip(host, self._rows, death_timeout=death_timeout, isolate=isolate)
        host.tensor_link = BridgeLink(self._bridge, death_timeout)
        host.collective = collective_link(self._store, gid)
        failure = host.start()
        if failure is None:
            self._hosts[gid] = host
        self._reply(cid, failure is None, failure)

    def _call(
        self,
        cid: int,
        gid: str,
        method: str,
        values: list[tuple[int, Any, int]],
        arg_slots: tuple[int, ...],
        kwarg_slots: dict[str, int],
        instructions: Instructions,
    ) -> None:
        host = self._hosts.get(gid)
        rank = -1 if host is None else host.rank
        try:
            if host is None:
                raise RuntimeError(f"no worker of group {gid!r} lives on process rank {self._rank}")
            resolved = {slot: self._receive(header, first) for slot, header, first in values}
        except BaseException as exc:  # noqa: BLE001
            self._reply(cid, False, RemoteFailure.capture(rank, method, exc))
            return
        args = tuple(resolved[s] for s in arg_slots)
        kwargs = {k: resolved[s] for k, s in kwarg_slots.items()}
        del resolved
        ok, value = host.run(method, args, kwargs, instructions)
        del args, kwargs
        self._reply(cid, ok, value, method=method, rank=rank)

    def _receive(self, header: Any, first: int) -> Any:
        buffers, device = self._transport.recv(header, HUB, first, self._hub_tags)
        return unpack(header, buffers, device)

    def _status(self, message: tuple[Any, ...]) -> None:
        assert self._link is not None  # noqa: S101 - connected before the first command
        self._link.send(encode(message))

    def _reply(self, cid: int, ok: bool, value: Any, *, method: str = "", rank: int = -1) -> None:
        """Send the status; a value's payload is posted first, for the hub to drain."""
        if not ok:
            self._status(("done", cid, False, value, 0))
            return
        if value is None:  # most calls without data: no pickler, no payload, no header
            self._status(("done", cid, True, None, 0, None))
            return
        try:
            packed = pack(value)
        except BaseException as exc:  # noqa: BLE001
            failure = RemoteFailure.unpicklable(rank, method, "result", exc, in_process=False, value=value)
            self._status(("done", cid, False, failure, 0))
            return
        first = self._transport.sent.take(packed.header.tags)
        works = self._transport.post(packed, HUB, first)
        layout = batch_layout(value, packed)
        self._status(("done", cid, True, packed.header, first, layout))
        # The hub's reader receives a payload as soon as it reads the status, so waiting here is short;
        # it saves a hand-off to the send reaper's thread per result.
        for work in works:
            try:
                work.wait()
            except Exception:  # noqa: BLE001, S112 - the hub is gone; the loop sees it next
                continue

    # -- housekeeping -------------------------------------------------------------
    def _finish(self) -> None:
        if self._rows is not None:
            self._rows.close()
        self._bridge.close()
        self._transport.reaper.drain(10.0)
        for host in self._hosts.values():
            host.close()
        self._hosts.clear()
        try:
            self._transport.send_canary().wait()
        except Exception:  # noqa: BLE001, S110 - the hub is gone already
            pass
        try:
            self._status(("stopped", socket.gethostname(), os.getpid()))
        except Exception:  # noqa: BLE001, S110 - the hub may be gone already
            pass
        if self._link is not None:
            self._link.close()
        self._transport.close()

    def _heartbeat(self) -> None:
        """Tell the hub this process is alive; leave if the hub stopped long ago."""
        store = self._store.clone()  # type: ignore[attr-defined]  # Store.clone is missing from torch's stubs
        stopping_since: float | None = None
        while not self._done.wait(HEARTBEAT_S):
            try:
                store.add(heartbeat_key(self._rank), 1)
                if stopping_since is None and store.check([STOPPING_KEY]):
                    stopping_since = time.monotonic()
            except Exception:  # noqa: BLE001 - the store (the hub, or torchrun's agent) is gone
                os._exit(0)
            if stopping_since is not None and time.monotonic() - stopping_since > STOP_GRACE_S:
                # The driver is done and this rank is stuck in a call: leave.
                os._exit(0)
