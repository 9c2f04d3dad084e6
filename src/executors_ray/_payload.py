"""How arguments and results cross into and out of Ray's object store.

Every value is pickled once on the sending side (the C pickler, falling
back to :func:`dispatchcore._serialization.dumps` for code that must travel
by value): tensors become flat ``uint8`` numpy views, which Ray's own
pickle-5 serializer writes into the object store without an extra copy and
hands back as read-only views of shared memory (torch tensors pickled by Ray
would go through ``torch.save`` of their whole storage instead).  A packed
value is ``(pickle_bytes, [uint8 arrays])``.

Small values ride inside each task (Ray inlines arguments under 100 KiB, the
cheapest path); larger ones are ``ray.put`` once and every rank that needs
them gets the same reference; when every rank shares the driver's node, all
of a call's large values go into one object (one store round trip).  Plain atoms and Ray ``ObjectRef`` s are passed
as they are (Ray resolves top-level references itself, as verl users expect).
"""

from __future__ import annotations

import copyreg
import io
import pickle
import sys
from typing import Any

import numpy as np
import torch

from dispatchcore._isolation import ATOMS
from dispatchcore._serialization import PROTOCOL, Serialized, dumps, loads, reduce_tensor

#: Packed values smaller than this travel inside each task, larger ones by reference.
INLINE_LIMIT = 96 * 1024

#: Kinds of value a rank receives (one per distinct argument); FORWARD is a
#: chunk of another group's result that the rank fetches itself (``_forward``).
RAW, PACKED, FORWARD = 0, 1, 2

#: Exact atom types (the core's): a rank returns these as they are (never a tuple, so never a tag).
ATOM_TYPES = ATOMS

Packed = tuple[bytes, list[Any]]  # uint8 arrays, or bytes for small payloads


def is_raw(value: Any) -> bool:
    """Values passed to Ray untouched: atoms and object references."""
    if type(value) in ATOMS:
        return True
    return type(value).__name__ == "ObjectRef" and type(value).__module__.startswith("ray")


def _reduce_tensor(t: torch.Tensor) -> Any:
    """Plain strided CPU/GPU tensors as their own bytes; anything else as torch pickles it."""
    if t.layout == torch.strided and not t.is_quantized and t.device.type != "meta":
        return reduce_tensor(t)
    return t.__reduce_ex__(PROTOCOL)


class _CPickler(pickle.Pickler):
    """The C pickler, tensors out of band through its dispatch table: no Python hook per object.

    cloudpickle (``dumps``) calls two Python hooks for every object pickled,
    ~50 us for one DataProto chunk, paid on the driver and again on the
    rank for its result.  This pickler writes functions and classes by
    reference, which is wrong only for code that has to travel by value
    (``__main__`` and modules registered with cloudpickle); :func:`pack`
    notices their module names in the stream and pickles again with
    cloudpickle.
    """

    dispatch_table = {**copyreg.dispatch_table, torch.Tensor: _reduce_tensor}


def _by_value_modules() -> tuple[bytes, ...]:
    """Module names whose code cloudpickle ships by value (checked on every pack: the set can grow)."""
    names = {"__main__"}
    for module in ("cloudpickle.cloudpickle", "ray.cloudpickle.cloudpickle"):
        loaded = sys.modules.get(module)
        names.update(getattr(loaded, "_PICKLE_BY_VALUE_MODULES", ()))
    return tuple(name.encode() for name in names)


def pack(value: Any) -> Packed:
    """``value`` as pickle bytes plus uint8 views of its out-of-band buffers (no copy)."""
    file = io.BytesIO()
    buffers: list[pickle.PickleBuffer] = []
    try:
        _CPickler(file, protocol=PROTOCOL, buffer_callback=buffers.append).dump(value)
    except Exception:  # noqa: BLE001 - lambdas, local classes, ...: cloudpickle below
        data = b""
    else:
        data = file.getvalue()
    if not data or any(name in data for name in _by_value_modules()):
        serialized = dumps(value)
        data, buffers = serialized.data, serialized.buffers
    return data, [np.frombuffer(b.raw(), dtype=np.uint8) for b in buffers]


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


class EncodeError(Exception):
    """A value that cannot be sent (the cause is chained)."""

    def __init__(self, value: Any) -> None:
        super().__init__(f"cannot encode a {type(value).__name__}")
        self.value = value


#: ``(kind, where, value)``: ``where`` is ``None`` for a value sent inline, else
#: ``(object ref, index in it or None)``; ``value`` is what to send inline.
Encoded = tuple[int, Any, Any]


def encode_all(values: list[Any], put: Any, bundle: bool) -> list[Encoded]:
    """Each distinct argument of a call, ready for the ranks' tasks.

    Small values travel inline in each task (Ray inlines small arguments,
    the cheapest path); large ones go to the object store.  With ``bundle``
    (every rank on this node) all large values share one ``ray.put``: one
    store round trip instead of one per chunk, each rank reading only its
    own chunk's buffers from it, zero-copy.  Across nodes each large value
    is its own object, so a node fetches only what its ranks need.
    """
    from ._forward import Forwarded

    out: list[Encoded] = []
    large: list[int] = []
    for value in values:
        if isinstance(value, Forwarded):
            out.append((FORWARD, None, value))
            continue
        try:
            if is_raw(value):
                if isinstance(value, (str, bytes)) and len(value) >= INLINE_LIMIT:
                    out.append((RAW, (put(value), None), None))  # Ray resolves the top-level reference
                else:
                    out.append((RAW, None, value))
                continue
            packed = pack(value)
        except Exception as exc:
            raise EncodeError(value) from exc
        if packed_nbytes(packed) < INLINE_LIMIT:
            out.append((PACKED, None, _as_bytes(packed)))
        else:
            large.append(len(out))
            out.append((PACKED, None, packed))
    if len(large) > 1 and bundle:
        ref = put(tuple(out[i][2] for i in large))
        for member, i in enumerate(large):
            out[i] = (PACKED, (ref, member), None)
    else:
        for i in large:
            out[i] = (PACKED, (put(out[i][2]), None), None)
    return out


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
