"""Freeze a process for a test: SIGSTOP, then wait until every one of its threads has stopped.

``kill(pid, SIGSTOP)`` returns before a multi-threaded process is still: the kernel wakes one
thread to take the signal, and the others stop only once that thread has run.  On a loaded
machine another thread (a rank's row server, say) can answer a request in that gap, and a test
that meant to ask a frozen process gets a live answer.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path


def freeze(pid: int, timeout: float = 10.0) -> None:
    """Stop ``pid`` and return once all its threads are stopped (Linux; elsewhere, just the signal)."""
    os.kill(pid, signal.SIGSTOP)
    tasks = Path(f"/proc/{pid}/task")
    if not tasks.is_dir():
        return
    deadline = time.monotonic() + timeout
    while not _all_stopped(tasks):
        if time.monotonic() > deadline:
            raise AssertionError(f"process {pid} still has running threads {timeout} s after SIGSTOP")
        time.sleep(0.005)


def _all_stopped(tasks: Path) -> bool:
    for stat in tasks.glob("*/stat"):
        try:
            state = stat.read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue  # the thread ended meanwhile
        if state not in ("T", "t"):
            return False
    return True
