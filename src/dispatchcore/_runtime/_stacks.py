"""Where a rank is: the Python stack of the thread running its method, and of every thread on request.

A stack starts where the user's code does; machinery and import-system runs are counted in a line each.
"""

from __future__ import annotations

import itertools
import sys
import threading
import traceback
from types import FrameType

#: Top-level modules that only run the method thread, never the user's code (plus the standard library):
#: by name, and by prefix (this package, its executors, plugins named after it).
_MACHINERY = frozenset({"ray", "pluggy", "cloudpickle"})
_MACHINERY_PREFIXES = ("dispatchcore", "executors_")
_IMPORT_SYSTEM = ("importlib", "_frozen_importlib", "_frozen_importlib_external")


def _top_module(frame: FrameType) -> str:
    return str(frame.f_globals.get("__name__") or "").partition(".")[0]


def _is_machinery(frame: FrameType) -> bool:
    top = _top_module(frame)
    return top in sys.stdlib_module_names or top in _MACHINERY or top.startswith(_MACHINERY_PREFIXES)


def format_user_stack(frame: FrameType) -> str:
    """``frame``'s stack, outermost first, from the first frame of the user's code (see the module docstring).

    That is the first one past the library's outermost frame (the rank's loop): what runs below it (a
    ``python -c`` entry, a thread's start) is machinery whatever its module.
    """
    frames = list(traceback.walk_stack(frame))[::-1]
    loop = next((i for i, (f, _) in enumerate(frames) if _top_module(f).startswith(_MACHINERY_PREFIXES)), 0)
    first = next((i for i, (f, _) in enumerate(frames) if i >= loop and not _is_machinery(f)), 0)
    lines = [f"  ... {first} frames of the method thread's machinery (threading, the rank's loop)\n"] if first else []
    for importing, group in itertools.groupby(
        frames[first:], key=lambda entry: _top_module(entry[0]) in _IMPORT_SYSTEM
    ):
        run = list(group)
        if importing:
            lines.append(f"  ... {len(run)} frames of the import system (a module being imported)\n")
        else:
            lines += traceback.StackSummary.extract(iter(run)).format()
    return "".join(lines)


def thread_stacks(method_thread: int | None, all_threads: bool = False) -> str:
    """The stack of thread ``method_thread`` (the one running worker methods), or of every thread, each named."""
    frames = sys._current_frames()
    names = {t.ident: t.name for t in threading.enumerate()}
    wanted = [method_thread] if method_thread is not None else []
    if all_threads:
        wanted += [ident for ident in frames if ident != method_thread]
    parts = []
    for ident in wanted:
        frame = frames.get(ident)
        title = f"thread {names.get(ident, '?')!r} ({ident})" + (
            " running the worker's methods" if ident == method_thread else ""
        )
        parts.append(f"{title}: not running" if frame is None else f"{title}:\n" + format_user_stack(frame).rstrip())
    return "\n\n".join(parts) if parts else "no thread runs the worker's methods"


def stacks_note(stacks: dict[int, str]) -> str:
    """The note added to an error for the ranks still running: each rank's stack, indented."""
    lines = ["where the ranks still running are (their method threads' stacks):"]
    for rank in sorted(stacks):
        body = "\n".join("    " + line for line in stacks[rank].splitlines())
        lines.append(f"  rank {rank}:\n{body}")
    return "\n".join(lines)
