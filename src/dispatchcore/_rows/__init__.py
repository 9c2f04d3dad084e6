"""Lazy results' data plane: rows kept on the ranks, their descriptions and requests, the driver's
ledger, ``LazyDataProto``.  Imports the layers below, never dispatch, workers or groups.
"""

from ._lazy_chunk import RowFetcher, resolve_lazy_arguments, send_lazy_arguments
from ._lazy_dataproto import LazyDataProto
from ._ledger import DEFAULT_BUDGET, RowLedger
from ._records import HeldRows, RowAccess, RowRequest
from ._remote import RemoteRows
from ._store import ROW_STORE, free_kept_rows, holds_kept_rows, kept_results, take_kept_rows

__all__ = [
    "DEFAULT_BUDGET",
    "ROW_STORE",
    "HeldRows",
    "LazyDataProto",
    "RemoteRows",
    "RowAccess",
    "RowFetcher",
    "RowLedger",
    "RowRequest",
    "free_kept_rows",
    "holds_kept_rows",
    "kept_results",
    "resolve_lazy_arguments",
    "send_lazy_arguments",
    "take_kept_rows",
]
