"""The one serialization path for executors that move bytes between processes.

:func:`dumps` / :func:`loads`: pickle 5, tensors as out-of-band buffers of exactly their bytes, and by
value the code a fresh rank cannot import by name.  Name by name: ``docs/executor-contract.md``.
"""

from __future__ import annotations

from .._wire import (
    INLINE_LIMIT,
    NUMPY_ALLOC_BYTES,
    PROTOCOL,
    Culprit,
    RowBuffers,
    Serialized,
    adopting,
    by_value_modules,
    cat_rows,
    dumps,
    dumps_portable,
    find_unpicklable,
    importable_by_name,
    loads,
    numpy_tensor,
    rebuild_tensor,
    receive_buffer,
    reduce_tensor,
    refresh_by_value,
    round_trip,
)

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
    "dumps_portable",
    "find_unpicklable",
    "importable_by_name",
    "loads",
    "numpy_tensor",
    "rebuild_tensor",
    "receive_buffer",
    "reduce_tensor",
    "refresh_by_value",
    "round_trip",
]
