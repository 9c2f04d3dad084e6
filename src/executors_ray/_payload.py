"""How arguments and results cross into and out of Ray's object store.

Pickling is :mod:`dispatchcore.wire`'s; what is Ray's is the packing around
it.  A packed value is ``(pickle_bytes, [uint8 arrays])``: Ray's own pickle-5
serializer writes numpy arrays into the object store without an extra copy
and hands them back as read-only views of shared memory (a torch tensor
pickled by Ray would go through ``torch.save`` of its whole storage).

Small values ride the control lane (``_lane``), or inside each task of the
core's row reads and frees (Ray inlines arguments under 100 KiB); larger
ones are ``ray.put`` once and every rank that needs them gets the same
reference; when every rank shares the driver's node, all
of a call's large values go into one object (one store round trip).  Plain
atoms and Ray ``ObjectRef`` s are passed as they are (Ray resolves top-level
references itself, as verl users expect).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from dispatchcore.executor import ATOMS, RemoteFailure
from dispatchcore.wire import INLINE_LIMIT, Serialized, dumps, loads

from ._tags import FAILED, FORWARD, PACKED, RAW, Forwarded

Packed = tuple[bytes, list[Any]]  # uint8 arrays, or bytes for small payloads


def is_raw(value: Any) -> bool:
    """Values passed to Ray untouched: atoms and object references."""
    if type(value) in ATOMS:
        return True
    return type(value).__name__ == "ObjectRef" and type(value).__module__.startswith("ray")


def _by_value_modules() -> tuple[bytes, ...]:
    """Module names whose code cloudpickle ships by value (checked on every pack: the set can grow)."""
    names = {"__main__"}
    for module in ("cloudpickle.cloudpickle", "ray.cloudpickle.cloudpickle"):
        loaded = sys.modules.get(module)
        names.update(getattr(loaded, "_PICKLE_BY_VALUE_MODULES", ()))
    return tuple(name.encode() for name in names)


def pack(value: Any) -> Packed:
    """``value`` as pickle bytes plus uint8 views of its out-of-band buffers (no copy).

    ``dumps(share_callables=True)`` takes the C pickler first (cloudpickle
    costs ~50 us per DataProto chunk in Python hooks, paid on the driver and
    again on the rank for its result).  Its stream crosses processes when it
    shared nothing and names no module whose code must travel by value
    (``__main__``, modules registered with cloudpickle); otherwise the value
    is pickled again the portable way.
    """
    try:
        serialized = dumps(value, share_callables=True)
        portable = not serialized.shared and not any(name in serialized.data for name in _by_value_modules())
    except Exception:  # noqa: BLE001 - e.g. a tensor the fast path cannot reduce: the portable path decides
        portable = False
    if not portable:
        serialized = dumps(value)
    return serialized.data, [np.frombuffer(b.raw(), dtype=np.uint8) for b in serialized.buffers]


def packed_nbytes(packed: Packed) -> int:
    return len(packed[0]) + sum(len(b) if isinstance(b, bytes) else int(b.nbytes) for b in packed[1])


def unpack(packed: Packed, copy: bool) -> Any:
    """Rebuild a packed value; ``copy=True`` gives private writable memory.

    Buffers that come out of Ray's object store are read-only and shared by
    every reader, so isolation needs the copy; ``copy=False`` wraps them.
    """
    data, buffers = packed
    return loads(Serialized(data, list(buffers)), copy=copy)


class EncodeError(Exception):
    """A value that cannot be sent (the cause is chained)."""

    def __init__(self, value: Any) -> None:
        super().__init__(f"cannot encode a {type(value).__name__}")
        self.value = value


#: ``(kind, where, value)``: ``where`` is ``None`` for a value sent inline, else
#: ``(object ref, index in it or None)``; ``value`` is what to send inline.
Encoded = tuple[int, Any, Any]


def encode_all(values: list[Any], put: Callable[[Any], Any], bundle: bool) -> list[Encoded]:
    """Each distinct argument of a row read or free, ready for the ranks' tasks (``rows`` group).

    Small values travel inline in each task (Ray inlines small arguments,
    the cheapest path); large ones go to the object store.  With ``bundle``
    (every rank on this node) all large values share one ``ray.put``: one
    store round trip instead of one per chunk, each rank reading only its
    own chunk's buffers from it, zero-copy.  Across nodes each large value
    is its own object, so a node fetches only what its ranks need.
    """
    out: list[Encoded] = []
    large: list[int] = []
    for value in values:
        if isinstance(value, Forwarded):
            out.append((FORWARD, None, value))  # Ray tracks the references inside it
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
    _put_large(out, large, put, bundle)
    return out


def encode_for_lane(values: list[Any], put: Callable[[Any], Any], bundle: bool, inline_max: int) -> list[Encoded]:
    """Each distinct argument of a call on the control lane (``_lane``).

    Values under ``inline_max`` bytes travel in the lane message (arrays out
    of band, from their own memory).  Larger ones go to the object store
    (one put, shared by every rank that reads them; one put
    for all of them when ``bundle``), and values holding object references
    (a forwarded chunk, an ``ObjectRef`` argument) can only be handed over by
    Ray: those become the top-level values of the call's stash task, a
    reference wrapped in a 1-tuple so that Ray passes it on unresolved.
    """
    out: list[Encoded] = []
    large: list[int] = []
    for value in values:
        if isinstance(value, Forwarded):
            out.append((FORWARD, (value, None), None))
            continue
        try:
            if is_raw(value):
                out.append((RAW, None, value) if type(value) in ATOMS else (RAW, ((value,), 0), None))
                continue
            packed = pack(value)
        except Exception as exc:
            raise EncodeError(value) from exc
        if packed_nbytes(packed) <= inline_max:
            out.append((PACKED, None, packed))
        else:
            large.append(len(out))
            out.append((PACKED, None, packed))
    _put_large(out, large, put, bundle)
    return out


def _put_large(out: list[Encoded], large: list[int], put: Callable[[Any], Any], bundle: bool) -> None:
    """Put the values at ``large`` into the object store: one object for all with ``bundle``, else one each."""
    if len(large) > 1 and bundle:
        ref = put(tuple(out[i][2] for i in large))
        for member, i in enumerate(large):
            out[i] = (PACKED, (ref, member), None)
    else:
        for i in large:
            out[i] = (PACKED, (put(out[i][2]), None), None)


def encode_result(value: Any) -> tuple[int, Any]:
    """A worker's return value, ready for Ray to store (tensors out of band)."""
    if is_raw(value):
        return RAW, value
    packed = pack(value)
    return PACKED, _as_bytes(packed) if packed_nbytes(packed) < INLINE_LIMIT else packed


def _as_bytes(packed: Packed) -> tuple[bytes, list[bytes]]:
    """Small payloads as plain bytes: Ray ships them with msgpack, without a pickle pass."""
    return packed[0], [b.tobytes() for b in packed[1]]


def decode_result(value: Any, *, copy: bool, rank: int, method: str) -> tuple[bool, Any]:
    """``(ok, value)`` from what a rank's ``call`` returned.

    That is an atom as it is, ``(OK_PACKED, payload)`` or ``(FAILED, failure)``.
    """
    if type(value) is not tuple:
        return True, value
    tag, payload = value
    if tag == FAILED:
        return False, payload
    try:
        return True, unpack(payload, copy=copy)
    except Exception as exc:  # noqa: BLE001 - e.g. a class the driver cannot import
        failure = RemoteFailure.capture(rank, method, exc)
        failure.message = f"its result cannot be unpickled on the driver ({exc})"
        return False, failure
