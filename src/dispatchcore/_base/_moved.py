"""Old module paths that pickles written before the core became packages name, as aliases."""

from __future__ import annotations

import importlib
import sys

#: Old module path -> the module that holds its names now.
MOVED = {
    "dispatchcore._dataproto": "dispatchcore._data._dataproto",
    "dispatchcore._tensor_batch": "dispatchcore._data._tensor_batch",
}


def install() -> None:
    """Make the old paths importable as the new modules themselves (called when ``dispatchcore`` is imported)."""
    for old, new in MOVED.items():
        sys.modules.setdefault(old, importlib.import_module(new))
