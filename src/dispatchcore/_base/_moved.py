"""Old module paths keep importing: each private module that moved is an alias of where it went.

The core's modules moved into concept packages (``_data``, ``_rows``,
``_dispatch``, ...).  Pickles written before the move name the old paths
(``DataProto.save_to_disk`` stores ``dispatchcore._dataproto.DataProto``), so
importing an old path gives the module that now holds its names.  The
CHANGELOG lists the same table.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from types import ModuleType

#: Old module path -> the module that holds its names now.
MOVED = {
    "dispatchcore._allocator": "dispatchcore._wire._allocator",
    "dispatchcore._bench_runner": "dispatchcore._cli._bench",
    "dispatchcore._buffer_pool": "dispatchcore._wire._buffers",
    "dispatchcore._builtin_modes": "dispatchcore._dispatch._builtin_modes",
    "dispatchcore._call": "dispatchcore._spi._call",
    "dispatchcore._call_checks": "dispatchcore._group._call_checks",
    "dispatchcore._call_context": "dispatchcore._dispatch._call_context",
    "dispatchcore._call_handle": "dispatchcore._runtime._call_handle",
    "dispatchcore._coerce": "dispatchcore._data._coerce",
    "dispatchcore._colocate": "dispatchcore._worker._colocate",
    "dispatchcore._column_plan": "dispatchcore._rows._column_plan",
    "dispatchcore._dataproto": "dispatchcore._data._dataproto",
    "dispatchcore._direct_call": "dispatchcore._dispatch._direct_call",
    "dispatchcore._dispatch_collect": "dispatchcore._worker._mesh",
    "dispatchcore._driver_traffic": "dispatchcore._trace._driver_traffic",
    "dispatchcore._errors": "dispatchcore._base._errors",
    "dispatchcore._executor": "dispatchcore._spi._executor_base",
    "dispatchcore._forward_plan": "dispatchcore._spi._forward_plan",
    "dispatchcore._fused": "dispatchcore._worker._fused",
    "dispatchcore._futures": "dispatchcore._dispatch._futures",
    "dispatchcore._group_view": "dispatchcore._group._group_view",
    "dispatchcore._hookspecs": "dispatchcore._spi._hookspecs",
    "dispatchcore._isolation": "dispatchcore._runtime._isolation",
    "dispatchcore._latch": "dispatchcore._base._latch",
    "dispatchcore._lazy_chunk": "dispatchcore._rows._lazy_chunk",
    "dispatchcore._lazy_columns": "dispatchcore._rows._lazy_columns",
    "dispatchcore._lazy_dataproto": "dispatchcore._rows._lazy_dataproto",
    "dispatchcore._membership": "dispatchcore._group._membership",
    "dispatchcore._meta_info": "dispatchcore._data._meta_info",
    "dispatchcore._method_proxy": "dispatchcore._group._method_proxy",
    "dispatchcore._minibatch": "dispatchcore._data._minibatch",
    "dispatchcore._modes": "dispatchcore._dispatch._modes",
    "dispatchcore._nd_dispatch": "dispatchcore._dispatch._nd_dispatch",
    "dispatchcore._options": "dispatchcore._base._options",
    "dispatchcore._padding": "dispatchcore._data._padding",
    "dispatchcore._plugins": "dispatchcore._spi._plugins",
    "dispatchcore._rank_env": "dispatchcore._spi._rank_env",
    "dispatchcore._rank_thread": "dispatchcore._runtime._rank_thread",
    "dispatchcore._register": "dispatchcore._dispatch._register",
    "dispatchcore._reuse_limit": "dispatchcore._wire._buffers",
    "dispatchcore._row_buffers": "dispatchcore._wire._buffers",
    "dispatchcore._row_fetch": "dispatchcore._rows._fetch",
    "dispatchcore._row_ledger": "dispatchcore._rows._ledger",
    "dispatchcore._row_reshape": "dispatchcore._data._reshape",
    "dispatchcore._row_store": "dispatchcore._rows._store",
    "dispatchcore._serialization": "dispatchcore._wire._serialization",
    "dispatchcore._tensor_batch": "dispatchcore._data._tensor_batch",
    "dispatchcore._tensordict_dispatch": "dispatchcore._data._tensordict_split",
    "dispatchcore._tensordict_interop": "dispatchcore._data._tensordict_interop",
    "dispatchcore._typed_method": "dispatchcore._dispatch._typed_method",
    "dispatchcore._worker_group": "dispatchcore._group._worker_group",
    "dispatchcore._worker_host": "dispatchcore._runtime._worker_host",
}


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an old path and hands back the new module itself (one module object, two names)."""

    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return importlib.import_module(MOVED[spec.name])

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run: the new module is already imported."""


def install() -> None:
    """Make the old paths importable (idempotent; called when ``dispatchcore`` is imported)."""
    if not any(isinstance(finder, _MovedModules) for finder in sys.meta_path):
        sys.meta_path.append(_MovedModules())
