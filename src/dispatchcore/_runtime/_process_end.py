"""Whether a rank's process has ended: what it used (a store, a port) must not go before it does.

A killed process lingers until the kernel has torn it down, and a backend may call it gone
earlier (Ray does once the kill is decided); ``/proc`` says when it really ended.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable

#: How often a wait looks again.
_POLL_S = 0.01


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` still runs (an exited one not yet reaped counts as ended)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            state = stat.read().rsplit(b")", 1)[-1].split()[0]
        return state not in (b"Z", b"X")
    except FileNotFoundError:
        return False
    except (OSError, IndexError):  # no /proc: ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except OSError:
            return True
        return True


def wait_processes_ended(pids: Iterable[int], until: float) -> list[int]:
    """Wait until every process of ``pids`` has ended or ``time.monotonic()`` reaches ``until``; those still running."""
    running = [pid for pid in pids if process_alive(pid)]
    while running and time.monotonic() < until:
        time.sleep(_POLL_S)
        running = [pid for pid in running if process_alive(pid)]
    return running
