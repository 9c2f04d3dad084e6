"""Where a rank is: the Python stack of the thread running its method, and of every thread on request.

A stack starts where the user's code does; machinery and import-system runs are counted in a line each.
"""

from __future__ import annotations

import itertools
import sys
import threading
import traceback
from collections.abc import Callable, Sequence
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


#: How long an error waits for its ranks' stacks before it is raised: it fires within its bound plus this.
STACKS_WAIT_S = 0.3
#: How long the stacks that had not come by then are waited for, in the background (then added as a note).
STACKS_TIMEOUT_S = 2.0
#: Asks ranks for their method threads' stacks within a number of seconds: ``{rank: stack}`` of those answering.
AskStacks = Callable[[Sequence[int], float], dict[int, str]]


def note_stacks_soon(ask: AskStacks, error: BaseException, ranks: Sequence[int]) -> None:
    """Add ``ranks``' stacks to ``error`` as a note, holding it back :data:`STACKS_WAIT_S` at most.

    A rank that answers later (a frozen or busy process) has its stack added to the same error's notes when it
    comes, within :data:`STACKS_TIMEOUT_S`: the error is never held back by the ranks it describes.
    """
    try:
        stacks = ask(ranks, STACKS_WAIT_S)
    except Exception:  # noqa: BLE001 - the error being raised matters more than its decoration
        return
    if stacks:
        error.add_note(stacks_note(stacks))
    late = [rank for rank in ranks if rank not in stacks]
    if late:
        error.add_note(
            f"the stacks of rank(s) {late} had not come {STACKS_WAIT_S:g} s after the error; they are added "
            f"to its notes (exc.__notes__) if they come within {STACKS_TIMEOUT_S:g} s"
        )
        threading.Thread(target=_note_late, args=(ask, error, late), name="dispatchcore-stacks", daemon=True).start()


def _note_late(ask: AskStacks, error: BaseException, ranks: list[int]) -> None:
    try:
        stacks = ask(ranks, STACKS_TIMEOUT_S)
    except Exception:  # noqa: BLE001 - nobody waits on this thread: a failed ask leaves the error as it was
        return
    if stacks:
        error.add_note("(came after the error was raised) " + stacks_note(stacks))
