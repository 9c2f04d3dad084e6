"""The executor's own process groups, built directly on its prefixed store.

The default process group belongs to the user, so the executor never calls
``init_process_group`` or ``new_group``: it constructs ``ProcessGroupGloo``
(CPU payloads) and, on first use, ``ProcessGroupNCCL`` (CUDA payloads) on a
``PrefixStore`` of its own.  Only point-to-point ops are used, each received
after the store message saying it was posted, so no rank ever sits in a
gloo op while idle (a gloo op that waits past its timeout kills the group).

The traffic is lazy results' rows moved between any two processes
(:class:`RowTagCounter`, tags from :data:`ROW_TAG_BASE` up).  CUDA rows get
NCCL groups of their own, one per direction (:meth:`Transport.rows_device_group`).
"""

from __future__ import annotations

import itertools
import queue
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from dispatchcore.executor import LOOPBACK

from ._wire import Header, Packed, empty_buffers, empty_device_tensors

#: gloo tags are int32; a bridge's messages (``_bridge``) wrap within this many.
_TAG_SPACE = 1 << 29
#: Row payloads (lazy results moved rank to rank) use tags from here up.
ROW_TAG_BASE = 1 << 30
_ROW_TAG_SPACE = (1 << 31) - 1 - ROW_TAG_BASE


class TagCounter:
    """Tags for one sender: unique per message, so concurrent calls never match wrongly."""

    def __init__(self, parity: int) -> None:
        self._parity = parity
        self._next = itertools.count()
        self._lock = threading.Lock()

    def take(self, count: int) -> int:
        """The first of ``count`` consecutive message numbers reserved for one value."""
        with self._lock:
            first = next(self._next)
            for _ in range(count - 1):
                next(self._next)
        return first

    def tag(self, number: int) -> int:
        return (number % _TAG_SPACE) * 2 + self._parity


class RowTagCounter(TagCounter):
    """Tags for the rows one process sends."""

    def __init__(self) -> None:
        super().__init__(0)

    def tag(self, number: int) -> int:
        return ROW_TAG_BASE + number % _ROW_TAG_SPACE


#: Queued after the last send: the reaper thread exits when it reaches it.
_STOP: Any = object()


class SendReaper:
    """Waits on posted sends in the background and then lets their buffers go.

    A gloo send only reports completion through ``wait()`` (``is_completed()``
    stays false until someone waits), so a daemon thread waits on them in
    order; the sender never blocks on its peer.
    """

    def __init__(self, name: str) -> None:
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._outstanding = 0
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def add(self, works: list[Any], keep: Any) -> None:
        """Hold ``keep`` (the tensors being sent) until every work in ``works`` is done."""
        if not works:
            return
        with self._cond:
            self._outstanding += 1
        self._queue.put((works, keep))

    def drain(self, timeout: float) -> bool:
        """Wait until every send so far has completed (or failed); False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: self._outstanding == 0, timeout)

    def close(self, timeout: float = 1.0) -> None:
        """Stop the reaper thread once the sends queued so far are done (idempotent)."""
        if self._thread.is_alive():
            self._queue.put(_STOP)
            self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            works, keep = item
            for work in works:
                try:
                    work.wait()
                except Exception:  # noqa: BLE001, S112 - the peer is gone; its death is reported elsewhere
                    continue
            del works, keep
            with self._cond:
                self._outstanding -= 1
                self._cond.notify_all()


def _gloo_group(store: dist.Store, rank: int, size: int, timeout: timedelta, loopback: bool) -> dist.ProcessGroupGloo:
    """The executor's gloo group; with ``loopback`` its connections listen on 127.0.0.1 only.

    Without a device, gloo binds to the address the hostname resolves to (or
    to ``GLOO_SOCKET_IFNAME``), reachable from the network.  A self-started
    world is on one machine, so it names a loopback device.  Under torchrun
    ranks may be on several nodes, so the default stays.
    """
    if not loopback:
        return dist.ProcessGroupGloo(store, rank, size, timeout)
    options = dist.ProcessGroupGloo._Options()  # type: ignore[attr-defined]
    options._timeout = timeout
    options._devices = [dist.ProcessGroupGloo.create_device(hostname=LOOPBACK)]
    options._threads = 2  # what the timeout-only constructor uses for one device
    return dist.ProcessGroupGloo(store, rank, size, options)


class Transport:
    """Point-to-point tensor payloads between this process and its peers."""

    def __init__(self, store: dist.Store, rank: int, size: int, timeout: timedelta, *, loopback: bool = False) -> None:
        self.rank = rank
        self.size = size
        self._store = store
        self._timeout = timeout
        self.gloo = _gloo_group(dist.PrefixStore("gloo/", store), rank, size, timeout, loopback)
        self._nccl: Any = None
        self._rows_nccl: dict[str, Any] = {}
        self._nccl_lock = threading.Lock()

    def _device_group(self) -> Any:
        """The NCCL group for CUDA payloads, built on first use (no GPU, no NCCL)."""
        with self._nccl_lock:
            if self._nccl is None:
                options = dist.ProcessGroupNCCL.Options()
                options._timeout = self._timeout
                self._nccl = dist.ProcessGroupNCCL(
                    dist.PrefixStore("nccl/", self._store), self.rank, self.size, options
                )
            return self._nccl

    def rows_device_group(self, sender: int, receiver: int) -> Any:
        """The NCCL group for CUDA rows moving ``sender`` -> ``receiver`` (built on first use).

        One group per direction: NCCL matches a pair's point-to-point ops in
        the order they were issued, so rows going both ways between two
        processes at once would deadlock on one communicator; with a group per
        direction each side only sends, or only receives, on it, in the order
        requests were made (one fetch at a time per process, ``_row_plane``).
        """
        lane = "up" if sender < receiver else "down"
        with self._nccl_lock:
            group = self._rows_nccl.get(lane)
            if group is None:
                options = dist.ProcessGroupNCCL.Options()
                options._timeout = self._timeout
                group = self._rows_nccl[lane] = dist.ProcessGroupNCCL(
                    dist.PrefixStore(f"nccl-rows-{lane}/", self._store), self.rank, self.size, options
                )
            return group

    def post(
        self,
        packed: Packed,
        peer: int,
        first: int,
        tags: TagCounter,
        device_group: Callable[[], Any] | None = None,
    ) -> list[Any]:
        """Post the sends of ``packed``'s payload; the caller keeps ``packed`` alive until they complete."""
        works = []
        number = first
        for buf in packed.buffers:
            if buf.numel():
                works.append(self.gloo.send([buf], peer, tags.tag(number)))  # type: ignore[attr-defined]  # stubs omit the backend's send/recv
                number += 1
        if packed.device_tensors:
            group = (device_group or self._device_group)()
            for t in packed.device_tensors:
                works.append(group.send([t.contiguous()], peer, 0))
        return works

    def post_recv(
        self,
        header: Header,
        peer: int,
        first: int,
        counter: TagCounter,
        targets: dict[int, torch.Tensor] | None = None,
        device_group: Callable[[], Any] | None = None,
    ) -> tuple[list[torch.Tensor], list[torch.Tensor], list[Any]]:
        """Post the receives of a value's payload; the buffers are filled once every work is waited on."""
        buffers = empty_buffers(header, targets)
        device = empty_device_tensors(header)
        works = []
        number = first
        for buf in buffers:
            if buf.numel():
                works.append(self.gloo.recv([buf], peer, counter.tag(number)))  # type: ignore[attr-defined]  # stubs omit the backend's send/recv
                number += 1
        if device:
            group = (device_group or self._device_group)()
            works.extend(group.recv([t], peer, 0) for t in device)
        return buffers, device, works

    def close(self) -> None:
        """Drop the process groups this transport built (never the user's), and its store.

        Their destructors join gloo's threads; ``ProcessGroup.shutdown()``
        followed by interpreter exit was seen to abort ("terminate called
        without an active exception"), so the groups are released, not shut.
        """
        self._nccl = None
        self._rows_nccl = {}
        self.gloo = None  # type: ignore[assignment]
        self._store = None  # type: ignore[assignment]
