"""How one message crosses a pipe: a small frame, then the raw buffers.

A message is a header (plain Python values) plus a list of parts, each a
:class:`dispatchcore.wire.Serialized` (a pickle stream and its out-of-band
tensor/numpy buffers).  The frame carries the header and every pickle
stream.  Small messages (at most :data:`dispatchcore.wire.INLINE_LIMIT`
bytes in all) carry their buffers in the frame too; larger ones send each
buffer as its own pipe message, received straight into a fresh numpy
buffer, so the receiver's tensors own private, writable memory.
"""

from __future__ import annotations

import pickle
from multiprocessing.connection import Connection
from typing import Any

from dispatchcore import wire


def send(conn: Connection, header: Any, parts: list[wire.Serialized]) -> None:
    """Send ``header`` and ``parts``; the caller serializes access to ``conn``."""
    raws = [[b.raw() for b in part.buffers] for part in parts]
    inline = sum(part.nbytes for part in parts) <= wire.INLINE_LIMIT
    streams = [
        (part.data, [bytearray(raw) for raw in rs] if inline else [raw.nbytes for raw in rs])
        for part, rs in zip(parts, raws, strict=True)
    ]
    conn.send_bytes(pickle.dumps((header, inline, streams), protocol=wire.PROTOCOL))
    if not inline:
        for rs in raws:
            for raw in rs:
                conn.send_bytes(raw)


def recv(conn: Connection) -> tuple[Any, list[wire.Serialized]]:
    """Receive one message; ``EOFError`` / ``OSError`` when the other end is gone."""
    header, inline, streams = pickle.loads(conn.recv_bytes())
    parts = []
    for data, buffers in streams:
        if not inline:
            buffers = [_recv_buffer(conn, nbytes) for nbytes in buffers]
        parts.append(wire.Serialized(data, buffers))
    return header, parts


def _recv_buffer(conn: Connection, nbytes: int) -> Any:
    buffer = wire.receive_buffer(nbytes)
    got = conn.recv_bytes_into(buffer)
    if got != nbytes:
        raise OSError(f"expected a {nbytes}-byte buffer, got {got} bytes")
    return buffer


def decode(part: wire.Serialized) -> Any:
    """The object in ``part``; its buffers were just received, so nothing is shared."""
    return wire.loads(part, copy=False)
