"""Tensors between the processes of a driver's groups, rank to rank: the bridge every process backend shares.

A bridge is a two-rank group (gloo for CPU tensors, NCCL for CUDA ones)
between one source process and one destination process, one direction
only, met on a store unique to the pair and to each process's incarnation
(its bridge id).  Where the pair meets: the store of the source's world
(torchrun), or one the source's bridge listens on itself (Ray): its address
rides the token.  The source's ``publish`` keeps a bucket's pieces and
returns a :class:`Token`; a destination's ``receive`` asks the source for
them on a link of its own, straight to the source process (its request
door: both ends prove the driver's lane secret before a byte is unpickled,
as every lane link does; the driver relays nothing), and posts its receives
straight into their places, returning at once; the core's ``apply`` step
waits.  A source that dies tears the bridge (the receive raises
``TensorSourceLost``); one that never answers is bounded by the destination
group's ``death_timeout``.  Only the pairs' rendezvous is on a store
(torch's, unauthenticated: docs/security.md); nothing on it is unpickled.
"""

from __future__ import annotations

import contextlib
import itertools
import socket
import threading
import uuid
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from .._base import DispatchRuntimeError
from .._lane import LaneAuthError, LaneLink, accept_link, offer_link
from .._spi import LOOPBACK
from .._transfer import TensorSourceLost
from .._wire import numpy_tensor
from .._worker import listening_store
from ._pairs import SendReaper, pair_group, peer_error

#: Keys of every bridge live under this prefix of the store where pairs meet.
_ROOT = "dispatchcore-bridge"
_TAG_SPACE = 1 << 30
#: What ``receive`` returns: wait for the bucket, get ``(tensors, shared)`` (``TensorLink``).
Arrival = Callable[[], tuple[list[torch.Tensor], bool]]


@dataclass(frozen=True)
class Token:
    """What the driver forwards from a source rank to its bucket's destinations (small, picklable)."""

    #: Where the pair meets (a ``TCPStore``).
    host: str
    port: int
    #: The source process's request door (lane-authenticated).
    door: tuple[str, int]
    source: str
    key: int
    #: Per piece: its bytes and whether it is a CUDA tensor.
    pieces: tuple[tuple[int, bool], ...]


class TensorBridge:
    """One process's side of every bridge: the pieces it published, its pair groups, its request door."""

    def __init__(self, secret: bytes, *, meet: tuple[str, int] | None = None, host: str = LOOPBACK) -> None:
        """``secret``: the driver's lane secret, which both ends of a request link prove.

        ``meet``: the store where this process's pairs meet (its world's); ``None``: one of its own, made on
        first publish.  ``host``: where its door (and own store) listen; loopback keeps every pair there too.
        """
        self._secret = secret
        self._meet = meet
        self._host = host
        self._loopback = host == LOOPBACK
        self._own_store: Any = None
        self.id = uuid.uuid4().hex
        self._lock = threading.Lock()
        self._keys = itertools.count()
        self._next_tag = 0
        self._held: dict[int, list[Any]] = {}
        self._stores: dict[tuple[str, int], dist.Store] = {}
        self._groups: dict[tuple[str, str, bool], Any] = {}
        self._links: dict[tuple[str, int], LaneLink] = {}
        self._served: list[LaneLink] = []
        self._reaper: SendReaper | None = None
        self._door: socket.socket | None = None
        self._closed = False

    # -- source side ----------------------------------------------------------------------
    def publish(self, tensors: list[torch.Tensor], readers: int, timeout: float) -> Token:
        """Keep ``tensors`` for ``readers`` requests; open the request door on first use."""
        flat = [t.reshape(-1).view(torch.uint8) for t in tensors]
        with self._lock:
            if self._closed:
                raise DispatchRuntimeError("this process's weight-transfer bridge is closed")
            key = next(self._keys)
            self._held[key] = [flat, readers]
            door = self._door_locked(timeout)
            meet = self._meet_locked()
        return Token(*meet, door, self.id, key, tuple((t.numel(), t.is_cuda) for t in flat))

    def _meet_locked(self) -> tuple[str, int]:
        """Where this process's pairs meet: its world's store, or its own (hold ``_lock``)."""
        if self._meet is None:
            self._own_store = listening_store(self._host)
            self._meet = (self._host, int(self._own_store.port))
        return self._meet

    def _door_locked(self, timeout: float) -> tuple[str, int]:
        """Where destinations ask for pieces, listening from the first publish on (hold ``_lock``)."""
        if self._door is None:
            self._reaper_locked()
            self._door = socket.create_server((self._host, 0), family=socket.getaddrinfo(self._host, 0)[0][0])
            threading.Thread(
                target=self._accept, args=(self._door, timeout), name="dispatchcore-bridge", daemon=True
            ).start()
        host, port = self._door.getsockname()[:2]
        return str(host), int(port)

    def _accept(self, door: socket.socket, timeout: float) -> None:
        while True:
            try:
                sock, _ = door.accept()
            except OSError:  # closed with the bridge
                return
            threading.Thread(
                target=self._serve, args=(sock, timeout), name="dispatchcore-bridge-link", daemon=True
            ).start()

    def _serve(self, sock: socket.socket, timeout: float) -> None:
        """One destination process's requests, once it proved the lane secret (else closed at once)."""
        try:
            accept_link(sock, self._secret)
        except (LaneAuthError, OSError):
            sock.close()
            return
        link = LaneLink(sock)
        with self._lock:
            if self._closed:
                link.close()
                return
            self._served.append(link)
        while True:
            try:
                _, reader, key, first = link.recv_object()
                self._send(reader, key, first, timeout)
            except (ConnectionError, OSError):
                return
            except Exception:  # noqa: BLE001, S112 - the reader is gone; its own group reports that
                continue

    def take(self, key: int) -> list[torch.Tensor] | None:
        """Bucket ``key``'s pieces for one reader (dropped after the last); ``None`` once gone."""
        with self._lock:
            entry = self._held.get(key)
            if entry is None:
                return None
            entry[1] -= 1
            if entry[1] <= 0:
                del self._held[key]
        return list(entry[0])

    def _send(self, reader: str, key: int, first: int, timeout: float) -> None:
        tensors = self.take(key)
        if tensors is None:
            return
        assert self._meet is not None  # noqa: S101 - set by the publish that kept these pieces
        works = []
        for i, t in enumerate(tensors):
            if t.numel():
                group = self._group(*self._meet, self.id, reader, 0, t.is_cuda, timeout)
                works.append(group.send([t], 1, (first + i) % _TAG_SPACE if not t.is_cuda else 0))
        assert self._reaper is not None  # noqa: S101 - made with the thread
        self._reaper.add(works, tensors)

    # -- destination side -----------------------------------------------------------------
    def receive(self, token: Token, into: list[torch.Tensor | None], timeout: float) -> Arrival:
        """Ask the source for ``token``'s pieces and start receiving them into ``into`` (or private memory).

        Returns at once; the callable waits (a CUDA piece lands on its device, then is copied to its place).
        """
        with self._lock:
            first = self._next_tag
            self._next_tag = (first + len(token.pieces)) % _TAG_SPACE
        try:
            self._link(token.door, timeout).send_object(("send", self.id, token.key, first))
            device = torch.device("cuda", torch.cuda.current_device()) if any(c for _, c in token.pieces) else None
            out, works = [], []
            for i, ((nbytes, cuda), target) in enumerate(zip(token.pieces, into, strict=True)):
                if target is not None and not cuda:
                    buf = target.reshape(-1).view(torch.uint8)
                else:
                    buf = _buffer(nbytes, device if cuda else None)
                out.append(buf)
                if nbytes:
                    group = self._group(token.host, token.port, token.source, self.id, 1, cuda, timeout)
                    works.append(group.recv([buf], 0, (first + i) % _TAG_SPACE if not cuda else 0))
        except Exception as exc:  # noqa: BLE001 - a torn bridge or a silent source: the core names it
            raise _lost(exc) from exc
        waited: list[bool] = []

        def arrival() -> tuple[list[torch.Tensor], bool]:
            waited.append(True)
            try:
                for work in works:
                    work.wait()
            except Exception as exc:  # noqa: BLE001 - as above
                raise _lost(exc) from exc
            return _placed(out, into, every=False), False

        weakref.finalize(arrival, self._abandoned, works, out, waited).atexit = False
        return arrival

    def _link(self, door: tuple[str, int], timeout: float) -> LaneLink:
        """This process's link to a source's request door (proved both ways), made on first use and kept."""
        with self._lock:
            link = self._links.get(door)
        if link is not None:
            return link
        sock = socket.create_connection(door, timeout=timeout)
        try:
            offer_link(sock, self._secret, 0)
        except BaseException:
            sock.close()
            raise
        with self._lock:
            link = self._links.setdefault(door, LaneLink(sock))
        return link

    def _abandoned(self, works: list[Any], buffers: list[torch.Tensor], waited: list[bool]) -> None:
        """A dropped transfer's receives nobody waited on (gloo's complete only through ``wait()``): reaped."""
        if waited or not works:
            return
        with self._lock:
            reaper = self._reaper_locked()
        reaper.add(works, buffers)

    def _reaper_locked(self) -> SendReaper:
        """The reaper of this bridge's sends and abandoned receives, made on first use (hold ``_lock``)."""
        if self._reaper is None:
            self._reaper = SendReaper(f"dispatchcore-bridge-reaper-{self.id[:6]}")
        return self._reaper

    # -- groups and stores ----------------------------------------------------------------
    def _connect(self, host: str, port: int, timeout: float) -> dist.Store:
        """A client connection to the store at ``host:port`` where pairs meet (one per address)."""
        with self._lock:
            store = self._stores.get((host, port))
            if store is None:
                store = self._stores[(host, port)] = dist.TCPStore(
                    host, port, None, False, timedelta(seconds=timeout), wait_for_workers=False
                )
            return store

    def _group(self, host: str, port: int, sender: str, reader: str, rank: int, cuda: bool, timeout: float) -> Any:
        """The bridge ``sender`` -> ``reader`` (this process is ``rank`` of it), built on first use."""
        name = (sender, reader, cuda)
        with self._lock:
            group = self._groups.get(name)
        if group is not None:
            return group
        kind = "nccl" if cuda else "gloo"
        store = dist.PrefixStore(f"{_ROOT}/pair/{sender}/{reader}/{kind}/", self._connect(host, port, timeout))
        group = pair_group(store, rank, cuda, timeout, loopback=self._loopback)
        with self._lock:
            return self._groups.setdefault(name, group)

    def close(self) -> None:
        """Stop serving, let queued sends finish briefly, drop every bridge and link (idempotent)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            door, self._door, self._held = self._door, None, {}
            links = [*self._links.values(), *self._served]
            self._links, self._served = {}, []
        if door is not None:
            with contextlib.suppress(OSError):
                door.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread (a close alone would not)
            door.close()
        for link in links:
            link.close()
        if self._reaper is not None:
            self._reaper.drain(5.0)
            self._reaper.close()
        self._groups.clear()
        self._stores.clear()
        self._own_store = None


def _buffer(nbytes: int, device: torch.device | None) -> torch.Tensor:
    """Private memory to receive ``nbytes`` into: the process's buffer pool on CPU."""
    if device is None:
        return numpy_tensor((nbytes,), torch.uint8)
    return torch.empty(nbytes, dtype=torch.uint8, device=device)


def _placed(pieces: list[torch.Tensor], into: list[torch.Tensor | None], *, every: bool) -> list[torch.Tensor]:
    """Each piece, or its place in ``into`` (copied there: ``every`` piece, or only CUDA ones received apart)."""
    for piece, target in zip(pieces, into, strict=True):
        if target is not None and (every or piece.is_cuda):
            target.reshape(-1).view(torch.uint8).copy_(piece)
    return [piece if target is None else target for piece, target in zip(pieces, into, strict=True)]


def _lost(exc: BaseException) -> TensorSourceLost:
    return TensorSourceLost(f"bridge to the source process failed: {peer_error(exc)}")


class TensorBridgeLink:
    """The :class:`~dispatchcore.executor.TensorLink` of one rank: its process's bridge, its group's bound."""

    same_process = False

    def __init__(self, bridge: TensorBridge, death_timeout: float) -> None:
        self._bridge = bridge
        self._timeout = max(float(death_timeout), 1.0)

    def publish(self, tensors: list[torch.Tensor], readers: int) -> Token:
        return self._bridge.publish(tensors, readers, self._timeout)

    def receive(self, token: Any, into: list[torch.Tensor | None]) -> Arrival:
        """The bucket's pieces: in place when the source is this process (colocated roles), else received."""
        if token.source != self._bridge.id:
            return self._bridge.receive(token, into, self._timeout)
        pieces = self._bridge.take(token.key)
        if pieces is None:
            raise TensorSourceLost("the bucket was dropped before it was read")
        got = _placed(pieces, into, every=True)
        return lambda: (got, True)  # the source's memory where kept: the core copies unless isolate=False
