"""Commands and statuses on one socket per rank, instead of through the store.

Every push to or pop from a c10d store queue is a round trip through the
store's server thread (in the driver, competing for the same cores), so a
call cost two of them per rank each way.  Measured here: one ping to 2 ranks
and back, 120 us through store queues, 16 us on direct sockets.  So the hub
listens once, ranks connect once at start-up (the store only tells them
where, and a token that keeps out anything that cannot read the world's
store), and each :class:`ControlLink` carries length-prefixed messages
(``_protocol``'s pickled tuples) in order.  A link that ends means the peer
process is gone or leaving.
"""

from __future__ import annotations

import collections
import secrets
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterable

import torch.distributed as dist

#: Store key under which the hub publishes "host port token".
CONTROL_KEY = "control"
_LENGTH = struct.Struct("<Q")
_HELLO = struct.Struct("<I16s")
#: How long a connecting rank may take to say who it is.
_HELLO_TIMEOUT_S = 10.0


class ControlLink:
    """An ordered channel of whole messages to one peer; sends are safe from any thread and never wait.

    A send goes straight into the socket when it has room (the usual case:
    no thread hop).  What does not fit, because the peer is busy in a long
    call and not reading, waits in a backlog that a writer thread drains in
    order, so submitting to a busy rank never blocks the caller (as a store
    queue never did).
    """

    def __init__(self, sock: socket.socket) -> None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(None)
        self._sock = sock
        self._reader = sock.makefile("rb")
        self._send_lock = threading.Lock()
        self._backlog: collections.deque[memoryview] = collections.deque()
        self._failed: OSError | None = None

    def send(self, message: bytes) -> None:
        """Send one message; raises ``OSError`` once the link is known broken."""
        frame = _LENGTH.pack(len(message)) + message
        with self._send_lock:
            if self._failed is not None:
                raise self._failed
            if self._backlog:  # the writer is draining earlier messages: queue behind them
                self._backlog.append(memoryview(frame))
                return
            try:
                sent = self._sock.send(frame, socket.MSG_DONTWAIT)
            except BlockingIOError:
                sent = 0
            if sent < len(frame):
                self._backlog.append(memoryview(frame)[sent:])
                threading.Thread(target=self._drain, name="dispatchcore-control-writer", daemon=True).start()

    def _drain(self) -> None:
        """Send the backlog in order (blocking); exits once it is empty."""
        while True:
            with self._send_lock:
                if not self._backlog:
                    return
                head = self._backlog[0]
            try:
                self._sock.sendall(head)
            except OSError as exc:  # the peer is gone; its reader reports that
                with self._send_lock:
                    self._failed = exc
                    self._backlog.clear()
                return
            with self._send_lock:
                self._backlog.popleft()

    def recv(self) -> bytes:
        """The next message, waiting for it; ``ConnectionError`` when the peer closed the link."""
        header = self._reader.read(_LENGTH.size)
        if len(header) < _LENGTH.size:
            raise ConnectionError("the control connection closed")
        (size,) = _LENGTH.unpack(header)
        message = self._reader.read(size)
        if len(message) < size:
            raise ConnectionError("the control connection closed mid-message")
        return message

    def close(self) -> None:
        """End the link; a thread waiting in :meth:`recv` on it wakes with ``ConnectionError``."""
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._reader.close()
        self._sock.close()


def _listener(host: str) -> socket.socket:
    if host in ("127.0.0.1", "localhost"):
        return socket.create_server(("127.0.0.1", 0))
    if socket.has_dualstack_ipv6():
        return socket.create_server(("", 0), family=socket.AF_INET6, dualstack_ipv6=True)
    return socket.create_server(("", 0))


def address_toward(host: str, port: int) -> str:
    """This machine's address on the route to ``host`` (where other nodes' ranks can reach it)."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)[0][0]
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect((host, port))  # no packet is sent: this only picks the outgoing interface
            return str(probe.getsockname()[0])
    except OSError:
        return socket.gethostname()


def accept_ranks(
    store: dist.Store,
    ranks: Iterable[int],
    host: str,
    timeout: float,
    gone: Callable[[int], str | None] = lambda rank: None,
) -> dict[int, ControlLink]:
    """On the hub: publish where to connect, then take one link from each of ``ranks``.

    ``gone(rank)`` says why a rank that has not connected yet never will (its
    process exited), so start-up fails at once instead of at ``timeout``.
    """
    waiting = set(ranks)
    links: dict[int, ControlLink] = {}
    token = secrets.token_bytes(16)
    with _listener(host) as server:
        port = server.getsockname()[1]
        store.set(CONTROL_KEY, f"{host} {port} {token.hex()}".encode())  # type: ignore[arg-type]  # the binding takes bytes
        deadline = time.monotonic() + timeout
        while waiting:
            for rank in sorted(waiting):
                reason = gone(rank)
                if reason is not None:
                    raise RuntimeError(f"rank process {rank} never connected to the driver: {reason}")
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(
                    f"rank processes {sorted(waiting)} did not connect to the driver within {timeout:g} s "
                    "(is a firewall in the way? raise start_timeout if start-up is slow)"
                )
            server.settimeout(min(left, 0.5))
            try:
                sock, _ = server.accept()
            except TimeoutError:
                continue
            who = _hello(sock, token)
            if who is not None and who in waiting:
                waiting.discard(who)
                links[who] = ControlLink(sock)
            else:
                sock.close()  # not one of ours (wrong token), or a rank already connected
    return links


def _hello(sock: socket.socket, token: bytes) -> int | None:
    """The rank a new connection belongs to, or ``None`` if it cannot prove it is one of this world's."""
    sock.settimeout(_HELLO_TIMEOUT_S)
    try:
        data = b""
        while len(data) < _HELLO.size:
            chunk = sock.recv(_HELLO.size - len(data))
            if not chunk:
                return None
            data += chunk
    except OSError:
        return None
    rank, offered = _HELLO.unpack(data)
    return int(rank) if secrets.compare_digest(offered, token) else None


def connect_to_hub(store: dist.Store, rank: int, timeout: float = 60.0) -> ControlLink:
    """On a rank: wait for the hub's address in the store, connect and say which rank this is."""
    host, port, token = store.get(CONTROL_KEY).decode().split()
    sock = socket.create_connection((host, int(port)), timeout=timeout)
    sock.sendall(_HELLO.pack(rank, bytes.fromhex(token)))
    return ControlLink(sock)
