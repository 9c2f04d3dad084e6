"""Values in Ray's object store as ``(pickle bytes, [uint8 arrays])``: Ray stores numpy buffers without a copy."""

from __future__ import annotations

from typing import Any

import numpy as np

from dispatchcore.wire import Serialized, dumps_portable, loads

Packed = tuple[bytes, list[Any]]


def pack(value: Serialized) -> Packed:
    """``value``'s stream and uint8 views of its out-of-band buffers (no copy), for the object store."""
    return value.data, [np.frombuffer(b.raw(), dtype=np.uint8) for b in value.buffers]


def serialized(packed: Packed) -> Serialized:
    """The inverse of :func:`pack` (over the store's read-only memory)."""
    return Serialized(packed[0], list(packed[1]))


def unpack(packed: Packed, copy: bool) -> Any:
    """Rebuild a packed value; ``copy=True`` gives private writable memory (store memory is shared)."""
    return loads(serialized(packed), copy=copy)


def is_object_ref(value: Any) -> bool:
    """Whether ``value`` is a Ray ``ObjectRef`` (checked by name: importing this module never imports ray)."""
    kind = type(value)
    return kind.__name__ == "ObjectRef" and kind.__module__.startswith("ray")


def pack_value(value: Any) -> Packed:
    """``value`` pickled for another process (:func:`dumps_portable`) and packed."""
    return pack(dumps_portable(value))
