"""One lane link: whole messages in order to one peer, sends that never wait.

Every push to or pop from a c10d store queue (or an actor task) is a round
trip through a server thread; a socket per peer is not.  Measured here: one
ping to 2 ranks and back, 120 us through store queues, 16 us on direct
sockets.  A message is length-prefixed bytes (the executor chooses what is
inside); a link that ends means the peer process is gone or leaving.
"""

from __future__ import annotations

import collections
import socket
import struct
import threading
from collections.abc import Sequence
from typing import Any

from .._wire import receive_buffer
from ._framing import frame_object, unframe_object

_LENGTH = struct.Struct("<Q")


class LaneLink:
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
        self._inbox = _Inbox(sock)
        self._send_lock = threading.Lock()
        self._backlog: collections.deque[memoryview] = collections.deque()
        self._failed: OSError | None = None

    def send(self, message: bytes) -> None:
        """Send one message; raises ``OSError`` once the link is known broken."""
        self.send_parts((message,))

    def send_parts(self, parts: Sequence[bytes | bytearray | memoryview]) -> None:
        """Send the concatenation of ``parts`` as one message, without joining them first.

        Large payloads (a tensor's bytes) go out straight from their own
        memory; the caller must not change them until the peer has answered.
        """
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

    def send_object(self, obj: Any) -> None:
        """Send ``obj`` pickled, its large buffers (numpy arrays) straight from their memory."""
        self.send_parts(frame_object(obj))

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

    def recv(self) -> bytearray:
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

    def take_ready(self) -> list[bytearray] | None:
        """Without waiting: the whole messages that arrived (maybe none); ``None`` once the peer closed.

        For one thread reading many links: call it when a selector says the
        link is readable (messages already read stay here until taken).
        """
        inbox = self._inbox
        inbox.take(wait=False)
        if inbox.ready:
            out = list(inbox.ready)
            inbox.ready.clear()
            return out
        return None if inbox.closed else []

    def has_ready(self) -> bool:
        """Whether a whole message is already read and waiting (a selector would not wake for it)."""
        return bool(self._inbox.ready)

    def close(self) -> None:
        """End the link; a thread waiting in :meth:`recv` on it wakes with ``ConnectionError``."""
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
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


class _Inbox:
    """Bytes read from one socket, cut into whole messages; one thread reads a link at a time."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._scratch = bytearray(_DIRECT)
        self._staged = bytearray()
        #: A large message being read into its own buffer, and how much of it arrived.
        self._body: bytearray | None = None
        self._filled = 0
        self.ready: collections.deque[bytearray] = collections.deque()
        self.closed = False

    def take(self, wait: bool) -> None:
        """Read what the socket holds; with ``wait``, block until at least one whole message (or the end)."""
        while not self.closed:
            flags = 0 if wait and not self.ready else socket.MSG_DONTWAIT
            try:
                if self._body is not None:
                    view = memoryview(self._body)[self._filled :]
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
            if self._body is not None:
                self._filled += n
                if self._filled == len(self._body):
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
            if size > _DIRECT:
                # From the buffer pool: memory already touched, handed back when the message's last view dies.
                body = receive_buffer(size)
                part = len(staged) - begin
                memoryview(body)[:part] = staged[begin:]
                self._body, self._filled = body, part
                start = len(staged)
            break
        if start:
            del staged[:start]
