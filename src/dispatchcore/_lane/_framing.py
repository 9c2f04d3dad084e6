"""Objects on a lane link: one pickle stream plus its large buffers, sent from their own memory.

Pickle protocol 5 hands out-of-band buffers (numpy arrays, ``PickleBuffer``)
to a callback instead of copying them into the stream.  A frame is a count,
the length of the stream and of each buffer, then the stream and the buffers
themselves, so a 64 MB array goes from its memory into the socket once and
lands in the receiver's private, writable memory once.
"""

from __future__ import annotations

import pickle
import struct
from typing import Any

_COUNT = struct.Struct("<I")
_SIZE = struct.Struct("<Q")


def frame_object(obj: Any) -> list[memoryview]:
    """The parts of one message holding ``obj`` (pass them to ``LaneLink.send_parts``)."""
    buffers: list[pickle.PickleBuffer] = []
    stream = pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
    views = [memoryview(stream), *(b.raw() for b in buffers)]
    table = _COUNT.pack(len(views)) + b"".join(_SIZE.pack(v.nbytes) for v in views)
    return [memoryview(table), *views]


def unframe_object(message: bytearray) -> Any:
    """The object :func:`frame_object` framed; its buffers are views of ``message`` (writable, private)."""
    view = memoryview(message)
    (count,) = _COUNT.unpack_from(view, 0)
    offset = _COUNT.size
    sizes = [_SIZE.unpack_from(view, offset + i * _SIZE.size)[0] for i in range(count)]
    offset += count * _SIZE.size
    parts = []
    for size in sizes:
        parts.append(view[offset : offset + size])
        offset += size
    return pickle.loads(parts[0], buffers=parts[1:])  # noqa: S301 - peers that proved the lane's token
