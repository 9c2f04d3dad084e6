"""The one serialization path for executors that move bytes between processes.

Everything a rank receives or sends back goes through :func:`dumps` /
:func:`loads`: pickle protocol 5 with tensors as out-of-band buffers of
exactly their own bytes, and code a fresh rank could not import by name (the
driver script's, a test module's) by value.  :func:`dumps_portable` takes
the C pickler when that is safe.  Receive large buffers with
:func:`numpy_tensor` / :func:`receive_buffer`, and rows the collect will
concatenate into a :class:`RowBuffers` (handed back as
``CallHandle.row_buffers``) so the concatenation adopts them.
:func:`find_unpicklable` names the object at fault when pickling fails.

The contract, name by name: ``docs/executor-contract.md``; why:
``docs/design.md`` ("Data path").
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
