"""The library's own messages between the processes of a driver's worlds, on authenticated links only.

Joining a group, rows' requests and reply headers, frees and the row
transport's next generation are small tuples (the weight bridge's requests
go straight to the source process, on a link of their own: ``_bridge``).
Each world process holds one link to its driver, which proved the driver's
lane secret both ways (``offer_link``/``accept_link``) before one byte was
unpickled; it sends ``(to, message)`` and the driver relays
(``_hub``).  A process is addressed ``(world identity, data rank)``; the
driver is data rank 0 of each of its worlds, and its posts are local.
Stores carry none of it.
"""

from __future__ import annotations

import logging
import socket
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

from dispatchcore.executor import LaneLink, offer_link

#: ``(world identity, data rank)``: where a message goes, and who sent it.
Address = tuple[str, int]
#: Called with the sender and the message, on the thread reading the link (keep it short).
Handler = Callable[[Address, tuple[Any, ...]], None]

_log = logging.getLogger(__name__)


class Post(ABC):
    """One process's handlers per message kind; :meth:`send` reaches any process of the driver's worlds."""

    def __init__(self, address: Address) -> None:
        self.address = address
        self._handlers: dict[str, Handler] = {}

    def on(self, kind: str, handler: Handler) -> None:
        """Have ``handler`` take every message whose first item is ``kind``."""
        self._handlers[kind] = handler

    def deliver(self, sender: Address, message: tuple[Any, ...]) -> None:
        """Hand ``message`` to its handler (one this process does not know is dropped)."""
        handler = self._handlers.get(message[0]) if isinstance(message, tuple) and message else None
        if handler is None:
            return
        try:
            handler(sender, message)
        except Exception:  # a handler's failure must not end the link that every message rides
            _log.exception("dispatchcore: handling a %r message failed", message[0])

    @abstractmethod
    def send(self, to: Address, message: tuple[Any, ...]) -> None:
        """Deliver ``message`` to the process at ``to`` (the driver relays; raises ``OSError`` once it is gone)."""


class LinkPost(Post):
    """A world process's post: its link to the driver, read by a thread of its own (``start``) until it ends."""

    def __init__(self, address: Address, link: LaneLink, on_end: Callable[[], None]) -> None:
        super().__init__(address)
        self._link = link
        self._on_end = on_end

    def start(self) -> None:
        """Read the link from now on (every handler is registered: a message without one is dropped)."""
        threading.Thread(target=self._read, name="dispatchcore-post", daemon=True).start()

    def send(self, to: Address, message: tuple[Any, ...]) -> None:
        if to == self.address:
            self.deliver(self.address, message)
        else:
            self._link.send_object((to, message))

    def _read(self) -> None:
        while True:
            try:
                sender, message = self._link.recv_object()
            except (ConnectionError, OSError):
                break
            self.deliver(tuple(sender), message)
        self._on_end()

    def close(self) -> None:
        self._link.close()


def connect_post(
    hub: tuple[str, int], address: Address, secret: bytes, timeout: float, on_end: Callable[[], None]
) -> LinkPost:
    """Connect to the driver's hub at ``hub``, prove ``secret`` as data rank ``address[1]`` (and check the driver)."""
    sock = socket.create_connection(hub, timeout=timeout)
    try:
        offer_link(sock, secret, address[1])
    except BaseException:
        sock.close()
        raise
    return LinkPost(address, LaneLink(sock), on_end)
