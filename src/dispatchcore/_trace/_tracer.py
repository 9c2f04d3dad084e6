"""Per-call timeline: dispatch, execute per rank, collect, as a Chrome/Perfetto trace.

Rank timings travel in ``Instructions.timed`` and come back as a :class:`TimedResult`, never in arguments.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class TimedResult:
    """A rank's value plus when (wall clock, µs) its method ran."""

    value: Any
    start_us: float
    end_us: float
    pid: int


def now_us() -> float:
    """Wall-clock microseconds: comparable across processes of one machine."""
    return time.time_ns() / 1000.0


class Tracer:
    """Collects trace events; one per open :func:`trace` block."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self._tracks: dict[str, int] = {}
        self._lock = threading.Lock()
        self.track("driver")

    def track(self, name: str) -> int:
        """The thread id of the track called ``name`` (created on first use)."""
        with self._lock:
            tid = self._tracks.get(name)
            if tid is None:
                tid = self._tracks[name] = len(self._tracks)
                self.events.append({"name": "thread_name", "ph": "M", "pid": 0, "tid": tid, "args": {"name": name}})
                self.events.append(
                    {"name": "thread_sort_index", "ph": "M", "pid": 0, "tid": tid, "args": {"sort_index": tid}}
                )
            return tid

    def slice(self, track: str, name: str, start_us: float, end_us: float, **args: Any) -> None:
        """Record one complete slice (``ph: X``) on ``track``."""
        event = {
            "name": name,
            "ph": "X",
            "pid": 0,
            "tid": self.track(track),
            "ts": start_us,
            "dur": max(0.0, end_us - start_us),
            "args": args,
        }
        with self._lock:
            self.events.append(event)

    def phase_totals(self, since: int = 0) -> dict[str, float]:
        """Seconds spent per phase name (``dispatch``/``collect``/...) in events after ``since``."""
        totals: dict[str, float] = {}
        for event in self.events[since:]:
            phase = event.get("args", {}).get("phase")
            if event.get("ph") == "X" and phase:
                totals[phase] = totals.get(phase, 0.0) + event["dur"] / 1e6
        return totals

    def write(self, path: str | os.PathLike[str]) -> Path:
        """Write the JSON trace-event file Perfetto opens."""
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        with self._lock:
            payload = {"traceEvents": list(self.events), "displayTimeUnit": "ms"}
        target.write_text(json.dumps(payload))
        return target


_active: contextvars.ContextVar[Tracer | None] = contextvars.ContextVar("dispatchcore_tracer", default=None)


def active_tracer() -> Tracer | None:
    """The tracer of the innermost open :func:`trace` block in this context, if any."""
    return _active.get()


@contextlib.contextmanager
def trace(path: str | os.PathLike[str] | None = None) -> Iterator[Tracer]:
    """Record every WorkerGroup call inside the block; write ``path`` at the end if given."""
    tracer = Tracer()
    token = _active.set(tracer)
    try:
        yield tracer
    finally:
        _active.reset(token)
        if path is not None:
            tracer.write(path)
