"""Bytes between processes: pickle 5, the buffer pool, receive buffers, the rank allocator.

The public face is :mod:`dispatchcore.wire`; this package imports only ``_base``.
"""

from ._allocator import keep_freed_memory
from ._buffers import NUMPY_ALLOC_BYTES, RowBuffers, adopting, cat_rows, numpy_tensor, receive_buffer
from ._by_value import by_value_modules, importable_by_name, refresh_by_value
from ._culprit import Culprit, find_unpicklable
from ._serialization import (
    INLINE_LIMIT,
    PROTOCOL,
    Serialized,
    dumps,
    dumps_in_process,
    dumps_portable,
    loads,
    round_trip,
)
from ._tensor_pickle import rebuild_tensor, reduce_tensor

__all__ = [
    "INLINE_LIMIT",
    "NUMPY_ALLOC_BYTES",
    "PROTOCOL",
    "Culprit",
    "RowBuffers",
    "Serialized",
    "adopting",
    "by_value_modules",
    "cat_rows",
    "dumps",
    "dumps_in_process",
    "dumps_portable",
    "find_unpicklable",
    "importable_by_name",
    "keep_freed_memory",
    "loads",
    "numpy_tensor",
    "rebuild_tensor",
    "receive_buffer",
    "reduce_tensor",
    "refresh_by_value",
    "round_trip",
]
