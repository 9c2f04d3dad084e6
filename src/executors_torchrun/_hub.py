"""The driver's end of its world processes' links (``_post``): admitted on proof, relayed, watched.

One hub per world, listening where the world's processes reach it
(loopback, or toward the store for a multi-node launch).  Each incoming
connection proves the driver's lane secret on a thread of its own within
``HANDSHAKE_TIMEOUT_S``; one that cannot is closed at once, counted in
``strangers``, and never delays the others.  The hub relays every message
between processes (of any of the driver's worlds) and remembers each row
fetch until its reply passes back, so a consumer waiting on a producer that
is gone is answered ``dead`` as soon as the driver knows: the producer's
link ended, or a lane found its rank gone (``gone``).  While fetches wait,
their producers are asked after by their groups' lanes (``watch``): the
lane's own liveness rule, nothing else.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable
from typing import Any

from dispatchcore.executor import LaneAuthError, LaneLink, accept_link, lane_secret

from ._post import Address, Post

#: Message kinds that ask a producer for rows (``(kind, fetch_id, ...)``), and those that answer one.
REQUESTS = frozenset({"fetch"})
REPLIES = frozenset({"rows", "failed"})
#: How often the producers awaited by a fetch are asked after, at most.
CHECK_S = 0.1
#: Says why data rank ``d`` is gone, or ``None`` (a group's lane, asked while a fetch waits on ``d``).
Check = Callable[[int], str | None]

_hubs: dict[str, Hub] = {}
_hubs_lock = threading.Lock()


def route(sender: Address, to: Address, message: tuple[Any, ...]) -> None:
    """Deliver ``message`` from ``sender`` to ``to``, both processes of this driver's worlds."""
    with _hubs_lock:
        home, there = _hubs.get(sender[0]), _hubs.get(to[0])
    if home is not None and message[0] in REPLIES:
        home.answered(sender[1], to, message[1])
    if there is not None:
        there.deliver(sender, to[1], message)
    elif message[0] in REQUESTS and home is not None:
        home.deliver(to, sender[1], ("stopped", message[1]))


def running(identity: str) -> bool:
    """Whether the world ``identity`` runs in this (driver) process: its processes can be asked for rows."""
    with _hubs_lock:
        return identity in _hubs


class LocalPost(Post):
    """The driver's own post in one world (data rank 0): sends go straight to the relay."""

    def send(self, to: Address, message: tuple[Any, ...]) -> None:
        route(self.address, to, message)


class Hub:
    """One world's links, by data rank, and the fetches waiting on each process (see module doc)."""

    def __init__(self, identity: str, host: str) -> None:
        self.identity = identity
        family = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM)[0][0]
        self._server = socket.create_server((host, 0), family=family)
        #: Where the world's processes connect (an address, public: the secret is what admits them).
        self.address = (host, int(self._server.getsockname()[1]))
        #: The driver's own post in this world.
        self.local = LocalPost((identity, 0))
        #: Connections closed because they could not prove the secret (for tests and logs).
        self.strangers = 0
        self._lock = threading.Condition()
        self._links: dict[int, LaneLink] = {}
        self._outbox: dict[int, list[tuple[Address, tuple[Any, ...]]]] = {}
        self._gone: dict[int, str] = {}
        self._pending: dict[int, set[tuple[Address, int]]] = {}
        self._checks: dict[str, Check] = {}
        self._closed = False
        with _hubs_lock:
            _hubs[identity] = self
        threading.Thread(target=self._accept, name="dispatchcore-hub", daemon=True).start()
        threading.Thread(target=self._watch, name="dispatchcore-hub-watch", daemon=True).start()

    # -- admitting ----------------------------------------------------------------------
    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._server.accept()
            except OSError:  # closed: the world is over
                return
            threading.Thread(target=self._admit, args=(sock,), name="dispatchcore-hub-admit", daemon=True).start()

    def _admit(self, sock: socket.socket) -> None:
        try:
            who = accept_link(sock, lane_secret())
        except LaneAuthError:
            who = -1
        with self._lock:
            known = who > 0 and who not in self._links and who not in self._gone and not self._closed
            if not known:
                self.strangers += 1
                sock.close()
                return
            link = self._links[who] = LaneLink(sock)
            for sender, message in self._outbox.pop(who, []):
                link.send_object((sender, message))
        threading.Thread(target=self._read, args=(who, link), name=f"dispatchcore-hub{who}", daemon=True).start()

    def _read(self, d: int, link: LaneLink) -> None:
        sender = (self.identity, d)
        while True:
            try:
                to, message = link.recv_object()
            except (ConnectionError, OSError):
                break
            except Exception:  # noqa: BLE001, S112 - a malformed message from a proved peer: dropped
                continue
            route(sender, tuple(to), message)
        self.gone(d, "its process ended (its link to the driver closed)")

    # -- relaying -----------------------------------------------------------------------
    def deliver(self, sender: Address, d: int, message: tuple[Any, ...]) -> None:
        """Hand ``message`` to process ``d`` (kept until it connects); a request to one gone is answered ``dead``."""
        if d == 0:
            self.local.deliver(sender, message)
            return
        with self._lock:
            reason = self._gone.get(d)
            if reason is None and self._closed and message[0] in REQUESTS:
                reason = "the torchrun world was stopped"
            if reason is None:
                if message[0] in REQUESTS:
                    self._pending.setdefault(d, set()).add((sender, message[1]))
                    self._lock.notify_all()
                link = self._links.get(d)
                if link is None:
                    self._outbox.setdefault(d, []).append((sender, message))
                    return
                with contextlib.suppress(OSError):  # its reader reports the end
                    link.send_object((sender, message))
                return
        if message[0] in REQUESTS:
            route((self.identity, d), sender, ("dead", message[1], reason))

    def answered(self, d: int, consumer: Address, fetch_id: int) -> None:
        """Process ``d`` replied to ``consumer``'s fetch ``fetch_id``: no longer waited on."""
        with self._lock:
            waiting = self._pending.get(d)
            if waiting is not None:
                waiting.discard((consumer, fetch_id))

    def gone(self, d: int, reason: str) -> None:
        """Process ``d`` is gone (``reason``): every fetch waiting on it is answered ``dead``, later ones too."""
        with self._lock:
            if d in self._gone or d == 0:
                return
            self._gone[d] = reason
            self._outbox.pop(d, None)
            waiting = self._pending.pop(d, set())
        for consumer, fetch_id in waiting:
            route((self.identity, d), consumer, ("dead", fetch_id, reason))

    def is_gone(self, d: int) -> bool:
        """Whether process ``d`` is known gone (its link ended, or a lane found it dead)."""
        with self._lock:
            return d in self._gone

    # -- liveness -----------------------------------------------------------------------
    def watch(self, key: str, check: Check) -> None:
        """Ask ``check(d)`` after each process ``d`` a fetch waits on (a group's lane); ``key`` names it."""
        with self._lock:
            self._checks[key] = check

    def unwatch(self, key: str) -> None:
        with self._lock:
            self._checks.pop(key, None)

    def _watch(self) -> None:
        while True:
            with self._lock:
                self._lock.wait_for(lambda: self._closed or any(self._pending.values()))
                if self._closed:
                    return
                awaited = [d for d, waiting in self._pending.items() if waiting]
                checks = list(self._checks.values())
            for d in awaited:
                for check in checks:
                    reason = check(d)
                    if reason is not None:
                        self.gone(d, reason)
                        break
            with self._lock:
                self._lock.wait(CHECK_S)

    # -- stopping -----------------------------------------------------------------------
    def close(self) -> None:
        """Stop listening, answer every waiting fetch ``stopped``, close the links (their processes leave)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            waiting, self._pending = self._pending, {}
            self._lock.notify_all()
        with contextlib.suppress(OSError):
            self._server.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread (a close alone would not)
        self._server.close()
        for d, fetches in waiting.items():
            for consumer, fetch_id in fetches:
                route((self.identity, d), consumer, ("stopped", fetch_id))
        with _hubs_lock:
            if _hubs.get(self.identity) is self:
                del _hubs[self.identity]
        with self._lock:
            links, self._links = self._links, {}
        self.local = LocalPost(self.local.address)  # the driver's handlers (and what they hold) go
        for link in links.values():
            link.close()
