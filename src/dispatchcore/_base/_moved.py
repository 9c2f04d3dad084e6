"""Old module paths that pickles written before the core became packages name, as aliases."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from types import ModuleType

#: Old module path -> the module that holds its names now.
MOVED = {
    "dispatchcore._dataproto": "dispatchcore._data._dataproto",
    "dispatchcore._tensor_batch": "dispatchcore._data._tensor_batch",
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
