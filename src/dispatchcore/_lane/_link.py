"""One lane link: whole messages in order to one peer, sends that never wait.

A socket per peer: a ping to 2 ranks and back took 120 us through store queues, 16 us on sockets.
"""

from __future__ import annotations

import collections
import contextlib
import socket
import struct
import threading
from collections.abc import Callable, Sequence
from typing import Any

from .._wire import receive_buffer
from ._framing import Placed, frame_object, frame_table, unframe_object

_LENGTH = struct.Struct("<Q")


class LaneLink:
    """An ordered channel of whole messages to one peer; sends are safe from any thread and never wait.

    A send goes straight into the socket when it has room; what does not fit
    (the peer is busy in a long call) waits in a backlog a writer thread drains.
    """

    def __init__(self, sock: socket.socket) -> None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(None)
        self._sock = sock
        self._inbox = _Inbox(sock)
        self._send_lock = threading.Lock()
        self._backlog: collections.deque[memoryview] = collections.deque()
        self._failed: OSError | None = None

    def send(self, message: bytes) -> None:
        """Send one message; raises ``OSError`` once the link is known broken."""
        self.send_parts((message,))

    def send_parts(self, parts: Sequence[bytes | bytearray | memoryview]) -> None:
        """Send the concatenation of ``parts`` as one message, straight from their memory (unchanged until answered)."""
        views = [memoryview(p).cast("B") for p in parts]
        header = _LENGTH.pack(sum(v.nbytes for v in views))
        with self._send_lock:
            if self._failed is not None:
                raise self._failed
            if self._backlog:  # the writer is draining earlier messages: queue behind them
                self._backlog.append(memoryview(header))
                self._backlog.extend(views)
                return
            frame = [memoryview(header), *views]
            try:
                sent = self._sock.sendmsg(frame, [], socket.MSG_DONTWAIT)
            except BlockingIOError:
                sent = 0
            rest = _after(frame, sent)
            if rest:
                self._backlog.extend(rest)
                threading.Thread(target=self._drain, name="dispatchcore-lane-writer", daemon=True).start()

    def send_object(self, obj: Any, note: bytes = b"") -> None:
        """Send ``obj`` pickled, large buffers from their memory; the peer's placer reads ``note`` first."""
        self.send_parts(frame_object(obj, note))

    def place_with(self, placer: Placer | None) -> None:
        """Let ``placer(note, part sizes)`` name memory for a large message's parts before they are read.

        It returns part index -> writable memory (or ``None``), on the reading
        thread; such a message comes out as a ``Placed``, which :func:`unframe_object` reads.
        """
        self._inbox.placer = placer

    def recv_object(self) -> Any:
        """The next object :meth:`send_object` sent; its arrays are private, writable memory."""
        return unframe_object(self.recv())

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

    def recv(self) -> Any:
        """The next message (private, writable memory), waiting for it; ``ConnectionError`` when the peer closed."""
        inbox = self._inbox
        while not inbox.ready:
            if inbox.closed:
                raise ConnectionError("the lane connection closed")
            inbox.take(wait=True)
        return inbox.ready.popleft()

    def fileno(self) -> int:
        """The socket's descriptor, for a selector watching several links from one thread."""
        return self._sock.fileno()

    def take_ready(self) -> list[Any] | None:
        """Without waiting: the whole messages that arrived (maybe none); ``None`` once the peer closed."""
        inbox = self._inbox
        inbox.take(wait=False)
        if inbox.ready:
            out = list(inbox.ready)
            inbox.ready.clear()
            return out
        return None if inbox.closed else []

    def close(self) -> None:
        """End the link; a thread waiting in :meth:`recv` on it wakes with ``ConnectionError``."""
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()


def _after(frame: list[memoryview], sent: int) -> list[memoryview]:
    """What of ``frame`` is left once its first ``sent`` bytes went out."""
    rest: list[memoryview] = []
    for view in frame:
        if sent >= view.nbytes:
            sent -= view.nbytes
            continue
        rest.append(view[sent:] if sent else view)
        sent = 0
    return rest


#: Messages larger than this are read straight into their own buffer (no staging copy).
_DIRECT = 1 << 16

#: Where a large message's parts land: ``placer(note, part sizes)`` -> part index -> memory, or ``None``.
Placer = Callable[[bytes, list[int]], "dict[int, memoryview] | None"]


class _Inbox:
    """Bytes read from one socket, cut into whole messages; one thread reads a link at a time."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._scratch = bytearray(_DIRECT)
        self._staged = bytearray()
        #: A large message being read: the message, and the memory still to fill, in order.
        self._body: Any = None
        self._segments: collections.deque[memoryview] = collections.deque()
        self.placer: Placer | None = None
        self.ready: collections.deque[Any] = collections.deque()
        self.closed = False

    def take(self, wait: bool) -> None:
        """Read what the socket holds; with ``wait``, block until at least one whole message (or the end)."""
        while not self.closed:
            flags = 0 if wait and not self.ready else socket.MSG_DONTWAIT
            try:
                if self._segments:
                    view = self._segments[0]
                    n = self._sock.recv_into(view, len(view), flags)
                else:
                    n = self._sock.recv_into(self._scratch, _DIRECT, flags)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                n = 0
            if n == 0:
                self.closed = True
                return
            if self._segments:
                head = self._segments.popleft()
                if n < head.nbytes:
                    self._segments.appendleft(head[n:])
                elif not self._segments:
                    self.ready.append(self._body)
                    self._body = None
            else:
                self._staged += memoryview(self._scratch)[:n]
                self._cut()

    def _cut(self) -> None:
        """Move whole messages out of the staged bytes; start a large one's own buffer."""
        staged = self._staged
        start = 0
        while len(staged) - start >= _LENGTH.size:
            (size,) = _LENGTH.unpack_from(staged, start)
            begin = start + _LENGTH.size
            if len(staged) - begin >= size:
                self.ready.append(staged[begin : begin + size])
                start = begin + size
                continue
            if size > _DIRECT and self._start_body(memoryview(staged[begin:]), size):
                start = len(staged)
            break
        if start:
            del staged[:start]

    def _start_body(self, head: memoryview, size: int) -> bool:
        """Start reading a large message (into pooled or placed memory); ``False``: stage more bytes first."""
        segments, message = self._segments_for(head, size)
        if segments is None:
            return False
        pending = collections.deque(segments)
        while head.nbytes and pending:  # what was staged already goes first
            segment = pending.popleft()
            n = min(head.nbytes, segment.nbytes)
            segment[:n] = head[:n]
            head = head[n:]
            if n < segment.nbytes:
                pending.appendleft(segment[n:])
        self._segments = pending
        if pending:
            self._body = message
        else:
            self.ready.append(message)
        return True

    def _segments_for(self, head: memoryview, size: int) -> tuple[list[memoryview] | None, Any]:
        """The memory a large message is read into, in order, and the message as it will be handed on."""
        table = frame_table(head) if self.placer is not None else None
        if self.placer is not None and (table is None or head.nbytes < table[0] + table[1][0]):
            if head.nbytes < _DIRECT:
                return None, None  # the note is not here yet: stage more
            table = None
        body = receive_buffer(size)
        whole = body.data.cast("B")
        if table is None or self.placer is None:
            return [whole], whole  # bytes-like, writable: what a small message is too
        offset, sizes = table
        targets = self.placer(bytes(head[offset : offset + sizes[0]]), sizes) or {}
        if not targets:
            return [whole], whole
        segments: list[memoryview] = []
        run = 0  # where the current run of unplaced bytes began
        for i, part in enumerate(sizes):
            if i in targets:
                if offset > run:
                    segments.append(whole[run:offset])
                segments.append(targets[i])
                run = offset + part
            offset += part
        if size > run:
            segments.append(whole[run:size])
        return segments, Placed(body, targets)
