"""What every planted-fault test needs: backends, moments of death, Ctrl-C, rows.

Times here are figures for RELIABILITY.md, never asserted: a test proves a
bound structurally (the other rank waits far longer than the test's timeout,
so only a prompt detection lets it pass) and records how long it took.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dispatchcore import available_backends

#: ``DISPATCHCORE_FAULTS_FULL=1`` (``scripts/reliability_report.py`` sets it) runs every case;
#: CI runs a subset that still covers each kind of fault on each backend.
FULL = os.environ.get("DISPATCHCORE_FAULTS_FULL") == "1"
full_only = pytest.mark.skipif(not FULL, reason="full fault run only (DISPATCHCORE_FAULTS_FULL=1)")

#: Backends whose ranks are processes: the only ones where a rank can die.
PROCESS_BACKENDS = ("ray", "torchrun", "multiprocess")
ALL_BACKENDS = ("local", *PROCESS_BACKENDS)
#: The RELIABILITY.md table of a backend's planted faults.
FAULT_TABLE = "faults/{backend}"
#: ``death_timeout`` of the groups that see a death: far above the detection
#: we expect (~0.1 s) and far below the tests' timeouts.
DEATH_TIMEOUT = 10.0


def backend_params(names: tuple[str, ...] = ALL_BACKENDS, *, full: tuple[str, ...] = ()) -> list[Any]:
    """``pytest.param`` per backend, skipped with the reason when it is not installed.

    Backends in ``full`` run only in the full fault run (see :data:`FULL`).
    """
    installed = set(available_backends())
    params = []
    for name in names:
        marks = [pytest.mark.skipif(name not in installed, reason=f"{name} not installed")]
        if name in full:
            marks.append(full_only)
        params.append(pytest.param(name, id=name, marks=marks))
    return params


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting to be reaped does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


class DeathWatch:
    """Notes the moment ``pid`` stops running (polled every 2 ms on a daemon thread)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.at: float | None = None
        self._gone = threading.Event()
        self._thread = threading.Thread(target=self._watch, name=f"death-watch-{pid}", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while alive(self.pid):
            time.sleep(0.002)
        self.at = time.monotonic()
        self._gone.set()

    def wait(self) -> float:
        """Block until the process is gone (the test's timeout bounds this); its moment of death."""
        self._gone.wait()
        self._thread.join()
        assert self.at is not None
        return self.at


def wait_until_gone(pids: list[int]) -> float:
    """Block until none of ``pids`` runs (the test's timeout is the bound); when that was."""
    while any(alive(p) for p in pids):
        time.sleep(0.02)
    return time.monotonic()


@contextlib.contextmanager
def ctrl_c_after(seconds: float, *, also: tuple[int, ...] = ()) -> Iterator[list[float]]:
    """SIGINT to the main thread after ``seconds``, as Ctrl-C does; yields ``[when it was sent]``.

    ``also`` are other pids to send it to at the same moment (a terminal's
    Ctrl-C reaches every process of the foreground group, ranks included).
    Leaving the block cancels a signal not yet sent.
    """
    sent: list[float] = []
    cancelled = threading.Event()
    main = threading.main_thread().ident
    assert main is not None and threading.current_thread().ident == main, "Ctrl-C goes to the main thread"

    def fire() -> None:
        if cancelled.wait(seconds):
            return
        for pid in also:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGINT)
        sent.append(time.monotonic())
        signal.pthread_kill(main, signal.SIGINT)

    timer = threading.Thread(target=fire, name="ctrl-c", daemon=True)
    timer.start()
    try:
        yield sent
    finally:
        cancelled.set()
        timer.join()


def fault_row(
    fault: str,
    error: BaseException | None,
    seconds: float,
    bound: float | str | None,
    usable_after: str,
    leaks: dict[str, Any] | str,
    *,
    where: str | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """One row of a backend's fault table, in the column order RELIABILITY.md shows.

    ``where`` defaults to the error's ``rank`` and ``method`` attributes.
    """
    if where is None:
        rank = getattr(error, "rank", None)
        method = getattr(error, "method", None)
        where = ", ".join(p for p in (f"rank {rank}" if rank is not None else "", repr(method) if method else "") if p)
    return {
        "fault": fault,
        "detected as": type(error).__name__ if error is not None else "-",
        "where": where or "-",
        "time to detect (s)": round(seconds, 3),
        "bound (s)": bound if bound is not None else "none",
        "group usable after": usable_after,
        "leaks": leaks if isinstance(leaks, str) else (_leak_text(leaks)),
        **extra,
    }


def _leak_text(leaks: dict[str, Any]) -> str:
    return "none" if not leaks else "; ".join(f"{k}: {v}" for k, v in leaks.items())
