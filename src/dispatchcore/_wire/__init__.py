"""Bytes between processes: pickle 5 with out-of-band tensor buffers, the buffer pool, receive buffers,
the rank allocator.

The public face is :mod:`dispatchcore.wire`; this package imports only ``_base``.
"""

from ._allocator import keep_freed_memory
from ._buffers import NUMPY_ALLOC_BYTES, RowBuffers, adopting, cat_rows, numpy_tensor, receive_buffer
from ._culprit import Culprit, find_unpicklable
from ._serialization import INLINE_LIMIT, PROTOCOL, Serialized, dumps, loads, round_trip
from ._tensor_pickle import rebuild_tensor, reduce_tensor

__all__ = [
    "INLINE_LIMIT",
    "NUMPY_ALLOC_BYTES",
    "PROTOCOL",
    "Culprit",
    "RowBuffers",
    "Serialized",
    "adopting",
    "cat_rows",
    "dumps",
    "find_unpicklable",
    "keep_freed_memory",
    "loads",
    "numpy_tensor",
    "rebuild_tensor",
    "receive_buffer",
    "reduce_tensor",
    "round_trip",
]
