"""Objects on a lane link: one pickle stream plus its large buffers, sent from their own memory.

Frame: a count, each part's length, then a note (read before anything large), the stream and the buffers.
"""

from __future__ import annotations

import pickle
import struct
from typing import Any, NamedTuple

_COUNT = struct.Struct("<I")
_SIZE = struct.Struct("<Q")


class Placed(NamedTuple):
    """A message some of whose parts a link read into memory of the receiver's choosing."""

    #: The whole message's bytes, except that the placed parts' bytes are in ``targets``.
    body: Any
    #: Part index -> the memory that part was read into.
    targets: dict[int, memoryview]


def frame_object(obj: Any, note: bytes = b"") -> list[memoryview]:
    """The parts of one message holding ``obj`` (pass them to ``LaneLink.send_parts``), ``note`` first."""
    buffers: list[pickle.PickleBuffer] = []
    stream = pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
    views = [memoryview(note), memoryview(stream), *(b.raw() for b in buffers)]
    table = _COUNT.pack(len(views)) + b"".join(_SIZE.pack(v.nbytes) for v in views)
    return [memoryview(table), *views]


def frame_table(view: memoryview) -> tuple[int, list[int]] | None:
    """``(table bytes, each part's size)`` from a frame's first bytes; ``None`` until enough of them are here."""
    if view.nbytes < _COUNT.size:
        return None
    (count,) = _COUNT.unpack_from(view, 0)
    table = _COUNT.size + count * _SIZE.size
    if view.nbytes < table:
        return None
    return table, [_SIZE.unpack_from(view, _COUNT.size + i * _SIZE.size)[0] for i in range(count)]


def unframe_object(message: bytearray | Placed) -> Any:
    """The object :func:`frame_object` framed; its buffers are views of ``message`` (writable, private)."""
    targets = message.targets if isinstance(message, Placed) else {}
    view = memoryview(message.body if isinstance(message, Placed) else message)
    offset, sizes = frame_table(view) or (0, [])  # a whole message: its table is all here
    parts = []
    for i, size in enumerate(sizes):
        parts.append(targets[i] if i in targets else view[offset : offset + size])
        offset += size
    return pickle.loads(parts[1], buffers=parts[2:])  # noqa: S301 - peers that proved the lane's token
