"""Opening a lane: a listener on one interface, a fresh token, and the handshake that proves a rank is one of ours."""

from __future__ import annotations

import secrets
import socket
import struct
import time
from collections.abc import Callable, Iterable
from types import TracebackType

from .._base import DispatchRuntimeError, DispatchTimeoutError, DispatchValueError
from ._address import LaneAddress
from ._link import LaneLink

_HELLO = struct.Struct("<I16s")
#: How long a connecting rank may take to say who it is.
HELLO_TIMEOUT_S = 5.0
_ANY = ("", "0.0.0.0", "::")  # noqa: S104 - named so that they are refused below


def _listener(host: str) -> socket.socket:
    """A listening socket on ``host`` only (``localhost`` means 127.0.0.1)."""
    if host in _ANY:
        raise DispatchValueError(f"a lane listens on one interface, not on {host!r}: pass the address ranks reach")
    if host == "localhost":
        host = "127.0.0.1"
    family = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM)[0][0]
    return socket.create_server((host, 0), family=family)


def address_toward(host: str, port: int) -> str:
    """This machine's address on the route to ``host`` (where other nodes' ranks can reach it)."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)[0][0]
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect((host, port))  # no packet is sent: this only picks the outgoing interface
            return str(probe.getsockname()[0])
    except OSError:
        return socket.gethostname()


class LaneDoor:
    """A listener ranks connect to while the driver accepts them (``with open_lane(host) as door``)."""

    def __init__(self, host: str) -> None:
        self._server = _listener(host)
        port = int(self._server.getsockname()[1])
        #: Where ranks connect and the token they must show (publish it through a :class:`LaneDirectory`).
        self.address = LaneAddress(host, port, secrets.token_bytes(16))
        #: Connections dropped because they could not prove they were ranks (for tests and logs).
        self.strangers = 0

    def accept(
        self,
        ranks: Iterable[int],
        timeout: float,
        gone: Callable[[int], str | None] = lambda rank: None,
    ) -> dict[int, LaneLink]:
        """One link from each of ``ranks`` within ``timeout`` s; ``gone(rank)``: why one never will (fail at once)."""
        waiting = set(ranks)
        links: dict[int, LaneLink] = {}
        deadline = time.monotonic() + timeout
        while waiting:
            for rank in sorted(waiting):
                reason = gone(rank)
                if reason is not None:
                    raise DispatchRuntimeError(f"rank process {rank} never connected to the driver: {reason}")
            left = deadline - time.monotonic()
            if left <= 0:
                raise DispatchTimeoutError(
                    f"rank processes {sorted(waiting)} did not connect to the driver within {timeout:g} s "
                    "(is a firewall in the way? raise start_timeout if start-up is slow)"
                )
            self._server.settimeout(min(left, 0.5))
            try:
                sock, _ = self._server.accept()
            except TimeoutError:
                continue
            who = _hello(sock, self.address.token)
            if who is not None and who in waiting:
                waiting.discard(who)
                links[who] = LaneLink(sock)
            else:
                self.strangers += 1
                sock.close()
        return links

    def close(self) -> None:
        """Stop listening (links already accepted stay open)."""
        self._server.close()

    def __enter__(self) -> LaneDoor:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


def open_lane(host: str) -> LaneDoor:
    """A door listening on ``host`` (loopback for a one-machine job) with a fresh token."""
    return LaneDoor(host)


def _hello(sock: socket.socket, token: bytes) -> int | None:
    """The rank a new connection belongs to, or ``None`` if it cannot prove it is one of ours."""
    sock.settimeout(HELLO_TIMEOUT_S)
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


def connect_lane(address: LaneAddress, rank: int, timeout: float = 60.0) -> LaneLink:
    """On a rank: connect to the door at ``address`` and say which rank this is."""
    sock = socket.create_connection((address.host, address.port), timeout=timeout)
    sock.sendall(_HELLO.pack(rank, address.token))
    return LaneLink(sock)
