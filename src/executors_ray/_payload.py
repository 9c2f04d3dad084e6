"""How arguments and results cross into and out of Ray's object store.

Every value goes through :func:`dispatchcore._serialization.dumps` once on
the sending side: tensors become flat ``uint8`` numpy views, which Ray's own
pickle-5 serializer writes into the object store without an extra copy and
hands back as read-only views of shared memory (torch tensors pickled by Ray
would go through ``torch.save`` of their whole storage instead).  A packed
value is ``(pickle_bytes, [uint8 arrays])``.

Small values ride inside each task (Ray inlines arguments under 100 KiB, the
cheapest path); larger ones are ``ray.put`` once and every rank that needs
them gets the same reference.  Plain atoms and Ray ``ObjectRef`` s are passed
as they are (Ray resolves top-level references itself, as verl users expect).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dispatchcore._serialization import Serialized, dumps, loads

#: Packed values smaller than this travel inside each task, larger ones by reference.
INLINE_LIMIT = 96 * 1024

#: Kinds of value a rank receives (one per distinct argument); FORWARD is a
#: chunk of another group's result that the rank fetches itself (``_forward``).
RAW, PACKED, FORWARD = 0, 1, 2

_ATOMS = (type(None), bool, int, float, complex, str, bytes)

Packed = tuple[bytes, list[Any]]  # uint8 arrays, or bytes for small payloads


def is_raw(value: Any) -> bool:
    """Values passed to Ray untouched: atoms and object references."""
    if isinstance(value, _ATOMS):
        return True
    return type(value).__name__ == "ObjectRef" and type(value).__module__.startswith("ray")


def pack(value: Any) -> Packed:
    """``value`` as pickle bytes plus uint8 views of its out-of-band buffers (no copy)."""
    serialized = dumps(value)
    return serialized.data, [np.frombuffer(b.raw(), dtype=np.uint8) for b in serialized.buffers]


def packed_nbytes(packed: Packed) -> int:
    return len(packed[0]) + sum(int(b.nbytes) for b in packed[1])


def unpack(packed: Packed, copy: bool) -> Any:
    """Rebuild a packed value; ``copy=True`` gives private writable memory.

    Buffers that come out of Ray's object store are read-only and shared by
    every reader, so isolation needs the copy; ``copy=False`` wraps them.
    """
    data, buffers = packed
    if copy:
        # numpy's allocator (hugepage-advised) copies large buffers ~3x faster
        # than the bytearray copy ``loads(copy=True)`` would make.
        return loads(Serialized(data, [np.frombuffer(b, dtype=np.uint8).copy() for b in buffers]), copy=False)
    return loads(Serialized(data, list(buffers)), copy=False)


def encode(value: Any, put: Any) -> tuple[int, Any]:
    """``(kind, what to pass to .remote)`` for one distinct argument.

    ``put`` is ``ray.put``; it is called only for values too large to inline.
    """
    if is_raw(value):
        if isinstance(value, (str, bytes)) and len(value) >= INLINE_LIMIT:
            return RAW, put(value)  # a top-level reference: Ray resolves it on the rank
        return RAW, value
    packed = pack(value)
    if packed_nbytes(packed) < INLINE_LIMIT:
        return PACKED, _as_bytes(packed)
    return PACKED, put(packed)


def decode(kind: int, value: Any, copy: bool) -> Any:
    """Inverse of :func:`encode` on the receiving side (references already resolved)."""
    if kind == RAW:
        return value
    return unpack(value, copy)


def encode_result(value: Any) -> tuple[int, Any]:
    """A worker's return value, ready for Ray to store (tensors out of band)."""
    if is_raw(value):
        return RAW, value
    packed = pack(value)
    return PACKED, _as_bytes(packed) if packed_nbytes(packed) < INLINE_LIMIT else packed


def _as_bytes(packed: Packed) -> tuple[bytes, list[bytes]]:
    """Small payloads as plain bytes: Ray ships them with msgpack, without a pickle pass."""
    return packed[0], [b.tobytes() for b in packed[1]]
