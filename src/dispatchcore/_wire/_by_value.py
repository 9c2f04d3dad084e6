"""Which modules' code travels by value: those a fresh rank process could not import by name.

A pytest test module or a notebook's helper reached the driver through a path inserted later; such
modules are registered with cloudpickle by value (when unsure: by value, slower, and the code arrives).
"""

from __future__ import annotations

import functools
import os
import site
import sys
import sysconfig
import threading
from collections.abc import Iterable
from pathlib import Path
from types import CodeType, ModuleType
from typing import Any

import cloudpickle

_lock = threading.Lock()
_judged: set[str] = set()
_seen_count = 0
_names: list[str] = []
#: Those of ``_names`` sent by value by this module's rule alone (not registered with cloudpickle by their author).
_by_rule: set[str] = set()
#: Stream markers of the modules sent by value: the module name as the pickler writes it.
_markers: tuple[bytes, ...] = ()


#: What cloudpickle writes for every code object's file name (it keeps payloads deterministic).
_ANONYMOUS_FILE = "<dynamic-code>"


def reduce_code(code: CodeType) -> Any:
    """cloudpickle's reduction of ``code``, keeping its real file name instead of ``<dynamic-code>``.

    Frames of driver-script code that ran on a rank then read ``File "/path/driver.py", line 25`` in
    tracebacks and stacks (and show the line, where the file is readable there), not ``<dynamic-code>``.
    """
    reduced = cloudpickle.CloudPickler.dispatch_table[CodeType](code)
    if not isinstance(reduced, tuple) or len(reduced) != 2 or not isinstance(code.co_filename, str):
        return reduced
    rebuild, args = reduced
    return rebuild, tuple(code.co_filename if a == _ANONYMOUS_FILE else a for a in args)


def _pth_paths(site_dir: str) -> Iterable[str]:
    """Directories that ``.pth`` files in ``site_dir`` add to every interpreter's path."""
    try:
        names = sorted(n for n in os.listdir(site_dir) if n.endswith(".pth"))
    except OSError:
        return
    for name in names:
        try:
            lines = Path(site_dir, name).read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            continue
        for line in lines:
            line = line.strip()
            if line and not line.startswith(("#", "import ", "import\t")):
                yield os.path.join(site_dir, line)


@functools.lru_cache(maxsize=1)
def _installed_dirs() -> tuple[str, ...]:
    """The standard library's and the site packages' directories."""
    dirs: list[str] = [p for key in ("stdlib", "platstdlib", "purelib", "platlib") if (p := sysconfig.get_path(key))]
    dynload = sysconfig.get_config_var("DESTSHARED")
    if isinstance(dynload, str):
        dirs.append(dynload)
    dirs += getattr(site, "getsitepackages", list)()
    if site.ENABLE_USER_SITE:
        dirs.append(site.getusersitepackages())
    return tuple(dirs)


@functools.lru_cache(maxsize=1)
def installed_prefixes() -> tuple[str, ...]:
    """Prefixes of files that installed code owns (a package may put its own vendored directory on the path)."""
    dirs = {*_installed_dirs(), *(os.path.realpath(d) for d in _installed_dirs())}
    return tuple(os.path.join(d, "") for d in sorted(dirs))


@functools.lru_cache(maxsize=1)
def startup_roots() -> frozenset[str]:
    """Directories every fresh interpreter of this environment has on its path (real paths and as given)."""
    roots = list(_installed_dirs())
    for directory in _installed_dirs():  # the site directories' .pth files (editable installs among them)
        roots += _pth_paths(directory)
    roots += [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    script = sys.argv[0] if sys.argv else ""
    if script.endswith(".py") and os.path.isfile(script):
        roots.append(os.path.dirname(os.path.abspath(script)))  # ranks run or get the script's directory
    return frozenset([*(os.path.abspath(p) for p in roots), *(os.path.realpath(p) for p in roots)])


@functools.lru_cache(maxsize=1)
def _distributed_top_levels() -> frozenset[str]:
    """Top-level packages installed distributions provide (editable installs through import hooks too)."""
    from importlib.metadata import packages_distributions

    try:
        return frozenset(packages_distributions())
    except Exception:  # noqa: BLE001 - a broken distribution's metadata must not break pickling
        return frozenset()


def _root_of(name: str, file: str) -> str | None:
    """The directory under which ``file`` is found as module ``name``, or ``None`` if it is not laid out so."""
    directory, base = os.path.split(file)
    stem = directory if base.split(".", 1)[0] == "__init__" else os.path.join(directory, base.split(".", 1)[0])
    tail = os.sep + name.replace(".", os.sep)
    return stem[: -len(tail)] if stem.endswith(tail) else None


def importable_by_name(module: ModuleType) -> bool:
    """Whether a fresh rank process imports ``module`` by its name (a submodule its parent made: as the parent)."""
    name = module.__name__
    if name == "__main__":
        return False
    file = getattr(module, "__file__", None)
    if name.partition(".")[0] in sys.stdlib_module_names or not isinstance(file, str):
        return True
    if file.startswith(installed_prefixes()) or _root_of(name, file) in startup_roots():
        return True
    if _root_of(name, os.path.realpath(file)) in startup_roots():  # the file system asked only now
        return True
    parent = sys.modules.get(name.rpartition(".")[0])
    if parent is not None and importable_by_name(parent):
        return True
    return name.partition(".")[0] in _distributed_top_levels()


def _marker(name: str) -> bytes:
    """``name`` as protocol 4/5 writes a short string (the form a global's module takes in the stream)."""
    raw = name.encode()
    return (b"\x8c" + bytes([len(raw)]) + raw) if len(raw) < 256 else raw


def refresh_by_value() -> None:
    """Register the modules imported since the last call that must go by value (call before own cloudpickling)."""
    global _seen_count, _markers
    if len(sys.modules) == _seen_count:
        return
    with _lock:
        modules = list(sys.modules.values())
        added = []
        for module in modules:
            name = getattr(module, "__name__", None)
            if not isinstance(module, ModuleType) or not isinstance(name, str) or name in _judged:
                continue
            _judged.add(name)  # under its own name: aliases (``__mp_main__``, moved paths) are judged once
            if name != "__main__" and sys.modules.get(name) is module and not importable_by_name(module):
                if name not in cloudpickle.list_registry_pickle_by_value():
                    _by_rule.add(name)  # by value because of where it was found, not because its author asked
                cloudpickle.register_pickle_by_value(module)
                added.append(name)
        if added:
            _names.extend(added)
            _markers = (*_markers, *(_marker(name) for name in added))
        _seen_count = len(modules)


def by_value_modules() -> list[str]:
    """Names of the modules whose code is pickled by value (besides ``__main__``), after a refresh."""
    refresh_by_value()
    return sorted(_names)


def by_value_by_rule() -> frozenset[str]:
    """Names of the modules sent by value only because a fresh process could not import them (after a refresh)."""
    refresh_by_value()
    return frozenset(_by_rule)


def names_by_value_module(data: bytes) -> bool:
    """Whether a pickle stream refers to ``__main__`` or a module sent by value (so it must be cloudpickled)."""
    refresh_by_value()
    return b"__main__" in data or any(marker in data for marker in _markers)
