"""Where a rank is: the Python stack of the thread running its method, and of every thread on request.

``sys._current_frames`` reads any thread's frame from another thread, so the
answer comes while the method is busy in Python and while it is blocked in C
code (a gloo op, a sleep: the frame is the Python call that entered C).
Executors call :func:`thread_stacks` wherever the rank lives (the rank's own
process, or this one for thread ranks) and send the text back.
"""

from __future__ import annotations

import sys
import threading
import traceback


def thread_stacks(method_thread: int | None, all_threads: bool = False) -> str:
    """The stack of thread ``method_thread`` (the one running worker methods), or of every thread.

    With ``all_threads`` each thread comes under a header naming it, the
    method thread first; a thread that is gone is said to be.
    """
    frames = sys._current_frames()
    names = {t.ident: t.name for t in threading.enumerate()}
    wanted = [method_thread] if method_thread is not None else []
    if all_threads:
        wanted += [ident for ident in frames if ident != method_thread]
    parts = []
    for ident in wanted:
        frame = frames.get(ident) if ident is not None else None
        title = f"thread {names.get(ident, '?')!r} ({ident})" + (
            " running the worker's methods" if ident == method_thread else ""
        )
        if frame is None:
            parts.append(f"{title}: not running")
            continue
        parts.append(f"{title}:\n" + "".join(traceback.format_stack(frame)).rstrip())
    return "\n\n".join(parts) if parts else "no thread runs the worker's methods"


def stacks_note(stacks: dict[int, str]) -> str:
    """The note added to an error for the ranks still running: each rank's stack, indented."""
    lines = ["where the ranks still running are (their method threads' stacks):"]
    for rank in sorted(stacks):
        body = "\n".join("    " + line for line in stacks[rank].splitlines())
        lines.append(f"  rank {rank}:\n{body}")
    return "\n".join(lines)
