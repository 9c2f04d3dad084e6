"""The one serialization path for executors that move bytes between processes.

For executor authors (``docs/design.md``, "Data path" and "The executor contract").  Everything a rank receives or sends
back goes through :func:`dumps` / :func:`loads`:

* pickle protocol 5 (:data:`PROTOCOL`); tensors and numpy arrays travel as
  out-of-band buffers of exactly their own bytes (a view never drags its
  whole storage along), rebuilt without a copy on the other side;
* functions and classes defined in the driver script, or in any module a
  fresh rank process could not import by name (a pytest test module, a
  helper put on ``sys.path`` at run time), travel by value (cloudpickle, a
  core dependency), with their class attributes, closures and the globals
  they use; installed code (site packages, editable installs,
  ``PYTHONPATH``, the standard library) goes by name
  (:func:`importable_by_name`, :func:`by_value_modules`; an executor that
  pickles with its own cloudpickle subclass calls :func:`refresh_by_value`
  first);
* :func:`dumps_portable` takes the C pickler when its stream names only
  code the ranks import, else cloudpickle (the fast path for process
  executors);
* :attr:`Serialized.data` plus :attr:`Serialized.buffers` is all there is to
  move; payloads whose total size is at most :data:`INLINE_LIMIT` are worth
  sending in one message with the control data, larger ones as raw buffers.

When something cannot be pickled, :func:`find_unpicklable` finds the object
at fault and the path to it (``cfg['callback']``, ``W.score → Registry.lock``);
:func:`dispatchcore.executor.unpicklable_error` and
:func:`~dispatchcore.executor.unpicklable_spec_error` turn it into the one
:class:`~dispatchcore.UnpicklableError` wording every backend raises.

Receive side: allocate large buffers with :func:`numpy_tensor` /
:func:`receive_buffer` (numpy memory page-faults far less than torch's), and
when a call's results are rows that the collect step will concatenate,
receive them into a :class:`RowBuffers` and hand it back as
``CallHandle.row_buffers``: the concatenation then adopts those rows instead
of copying them again.

``DataProto`` pickles with the same tensor layout under any protocol-5
pickler (Ray's included), so a backend whose transport pickles for it gets
the zero-copy path too.
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
