"""One thread that reads every lane link of a group: answers from N ranks wake one thread, not N."""

from __future__ import annotations

import contextlib
import logging
import queue
import selectors
import socket
import threading
from collections.abc import Callable, Sequence
from typing import Any

from ._link import LaneLink

log = logging.getLogger("dispatchcore.lane")


class LinkReader:
    """Reads the links added under their keys until :meth:`stop`, on one daemon thread."""

    def __init__(self, name: str, on_message: Callable[[Any, bytearray], None], on_end: Callable[[Any], None]) -> None:
        self._on_message = on_message
        self._on_end = on_end
        self._added: queue.SimpleQueue[tuple[Any, Sequence[LaneLink]] | None] = queue.SimpleQueue()
        self._waker, self._wakee = socket.socketpair()
        self._waker.setblocking(False)
        self._wakee.setblocking(False)
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def add(self, key: Any, links: Sequence[LaneLink]) -> None:
        """Read ``links`` from now on, under ``key``."""
        self._added.put((key, links))
        self._wake()

    def stop(self) -> None:
        """End the thread (links stay open; close them yourself)."""
        self._added.put(None)
        self._wake()

    def _wake(self) -> None:
        with contextlib.suppress(OSError):  # already woken (the buffer is full), or stopped
            self._waker.send(b"\0")

    def _loop(self) -> None:
        selector = selectors.DefaultSelector()
        selector.register(self._wakee, selectors.EVENT_READ, None)
        try:
            while True:
                for event, _ in selector.select():
                    if event.data is None:
                        if not self._take_added(selector):
                            return
                    else:
                        self._read(selector, *event.data)
        finally:
            selector.close()
            self._waker.close()
            self._wakee.close()

    def _take_added(self, selector: selectors.BaseSelector) -> bool:
        with contextlib.suppress(BlockingIOError):
            self._wakee.recv(4096)
        while not self._added.empty():
            added = self._added.get()
            if added is None:
                return False
            key, links = added
            for link in links:
                fd = link.fileno()
                if fd < 0:
                    continue  # closed again already
                if fd in selector.get_map():  # a closed link's number, reused by this one
                    selector.unregister(fd)
                selector.register(fd, selectors.EVENT_READ, (key, link))
        return True

    def _read(self, selector: selectors.BaseSelector, key: Any, link: LaneLink) -> None:
        messages = link.take_ready()
        for raw in messages or ():
            try:
                self._on_message(key, raw)
            except Exception:  # a bad message must not stop the thread every rank's answers wait on
                log.exception("dispatchcore lane: a message could not be handled")
        if messages is None:
            for registered in list(selector.get_map().values()):
                if registered.data is not None and registered.data[0] is key:
                    selector.unregister(registered.fd)
            self._on_end(key)
