"""Opening a lane: a listener on one interface, and the handshake that proves a connecting rank is one of ours.

Each connection proves it knows the driver's secret (``_secret``) on a thread
of its own, within ``HANDSHAKE_TIMEOUT_S``: a stranger that connects and says
nothing costs a thread for two seconds, never a rank's place in the queue.
"""

from __future__ import annotations

import contextlib
import queue
import socket
import threading
import time
from collections.abc import Callable, Iterable
from types import TracebackType

from .._base import DispatchRuntimeError, DispatchTimeoutError, DispatchValueError
from ._address import LaneAddress
from ._link import LaneLink
from ._secret import HANDSHAKE_TIMEOUT_S, LaneAuthError, accept_link, check_secret, lane_secret, offer_link

#: Handshakes in flight at once; a connection beyond them is closed unheard (a flood cannot pile up threads).
MAX_HANDSHAKES = 64
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

    def __init__(self, host: str, secret: bytes | None = None) -> None:
        self._secret = lane_secret() if secret is None else check_secret(secret)
        self._server = _listener(host)
        #: Where ranks connect (publish it anywhere: it opens nothing without the secret).
        self.address = LaneAddress(host, int(self._server.getsockname()[1]))
        #: Connections dropped because they could not prove they were ranks (for tests and logs).
        self.strangers = 0
        self._lock = threading.Lock()
        self._proved: queue.Queue[tuple[int, socket.socket]] = queue.Queue()
        self._slots = threading.BoundedSemaphore(MAX_HANDSHAKES)
        self._closed = False
        self._server.settimeout(0.25)  # a thread blocked in accept() would keep a closed listener open
        threading.Thread(target=self._take, name="dispatchcore-lane-door", daemon=True).start()

    def _take(self) -> None:
        """Take every connection while the door is open; each proves itself on a thread of its own."""
        while not self._closed:
            try:
                sock, _ = self._server.accept()
            except TimeoutError:
                continue
            except OSError:  # closed
                return
            if not self._slots.acquire(blocking=False):
                self._refuse(sock)
                continue
            threading.Thread(target=self._greet, args=(sock,), name="dispatchcore-lane-hello", daemon=True).start()

    def _greet(self, sock: socket.socket) -> None:
        try:
            who = accept_link(sock, self._secret, HANDSHAKE_TIMEOUT_S)
        except LaneAuthError:
            self._refuse(sock)
            return
        finally:
            self._slots.release()
        with self._lock:
            if not self._closed:
                self._proved.put((who, sock))
                return
        sock.close()  # proved after the door closed: nobody will take it

    def _refuse(self, sock: socket.socket) -> None:
        with self._lock:
            self.strangers += 1
        sock.close()

    def accept(
        self,
        ranks: Iterable[int],
        timeout: float,
        gone: Callable[[int], str | None] = lambda rank: None,
        rank_of: Callable[[int], int] = lambda who: who,
    ) -> dict[int, LaneLink]:
        """One link from each of ``ranks`` within ``timeout`` s; ``gone(rank)``: why one never will (fail at once).

        ``rank_of(who)``: the rank a link id belongs to (a rank may connect several links), as errors name it.
        """
        waiting = set(ranks)
        links: dict[int, LaneLink] = {}
        deadline = time.monotonic() + timeout
        while waiting:
            for rank in sorted({rank_of(who) for who in waiting}):
                reason = gone(rank)
                if reason is not None:
                    raise DispatchRuntimeError(f"rank process {rank} never connected to the driver: {reason}")
            left = deadline - time.monotonic()
            if left <= 0:
                missing = tuple(sorted({rank_of(who) for who in waiting}))
                raise DispatchTimeoutError(
                    f"rank processes {list(missing)} did not connect to the driver within {timeout:g} s "
                    "(is a firewall in the way? raise start_timeout if start-up is slow)",
                    ranks=missing,
                )
            try:
                who, sock = self._proved.get(timeout=min(left, 0.5))
            except queue.Empty:
                continue
            if who in waiting:  # a second link for one rank knows the secret too: a retry, dropped
                waiting.discard(who)
                links[who] = LaneLink(sock)
            else:
                self._refuse(sock)
        return links

    def close(self) -> None:
        """Stop listening (links already accepted stay open; proved ones never taken are closed)."""
        with self._lock:
            self._closed = True
        with contextlib.suppress(OSError):
            self._server.shutdown(socket.SHUT_RDWR)  # wakes a thread inside accept() at once
        self._server.close()
        while True:
            try:
                _, sock = self._proved.get_nowait()
            except queue.Empty:
                return
            sock.close()

    def __enter__(self) -> LaneDoor:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


def open_lane(host: str, secret: bytes | None = None) -> LaneDoor:
    """A door listening on ``host`` (loopback for a one-machine job); links prove ``secret`` (``lane_secret()``)."""
    return LaneDoor(host, secret)


def connect_lane(address: LaneAddress, rank: int, timeout: float = 60.0, secret: bytes | None = None) -> LaneLink:
    """On a rank: connect to the door at ``address``, prove ``secret`` (``lane_secret()``) and check the driver's proof.

    Raises :class:`LaneAuthError` when the listener cannot prove it knows the secret (nothing was unpickled).
    """
    key = lane_secret() if secret is None else check_secret(secret)
    sock = socket.create_connection((address.host, address.port), timeout=timeout)
    try:
        offer_link(sock, key, rank, max(HANDSHAKE_TIMEOUT_S, min(timeout, 30.0)))
    except BaseException:
        sock.close()
        raise
    return LaneLink(sock)
