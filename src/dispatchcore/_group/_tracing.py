"""The tracing hook of the call pipeline: slices for dispatch, execute per rank and collect (in a trace block)."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from .._spi import Call
from .._trace import TimedResult, Tracer, active_tracer, now_us

_call_ids = itertools.count()


class CallTrace:
    """One traced call's slices (driver track: dispatch, execute, collect; one track per rank)."""

    def __init__(self, tracer: Tracer, label: str, name: str, started: float) -> None:
        self.tracer = tracer
        self.label = label
        self.name = name
        self.started = started
        self.submitted = started
        self.call_id = next(_call_ids)

    @classmethod
    def begin(cls, label: str, prefix: str, name: str) -> CallTrace | None:
        """A trace for this call if a trace block is open (the name role-qualified), else ``None``."""
        tracer = active_tracer()
        if tracer is None:
            return None
        return cls(tracer, label, f"{prefix[:-1]}.{name}" if prefix else name, now_us())

    def dispatched(self, call: Call) -> None:
        """The dispatch slice ends as the call is submitted; its ranks are asked to time themselves."""
        self.submitted = now_us()
        self._slice("driver", f"{self.name} dispatch", self.started, self.submitted, "dispatch")
        call.instructions = replace(call.instructions, timed=True)

    def executed(self, call: Call, results: list[Any]) -> list[Any]:
        """The execute slice and each rank's compute slice; returns the plain results."""
        self._slice("driver", f"{self.name} execute", self.submitted, now_us(), "execute")
        return [self.rank_done(rank, value) for rank, value in zip(call.ranks, results, strict=True)]

    def rank_done(self, rank: int, value: Any) -> Any:
        """Rank ``rank``'s compute slice from its timed value (a ``TimedResult``); returns the plain value."""
        if not isinstance(value, TimedResult):
            return value
        track = f"{self.label} rank {rank}"
        self._slice(track, self.name, value.start_us, value.end_us, "compute", rank=rank, pid=value.pid)
        return value.value

    def unfinished(self, ranks: list[int], why: str) -> None:
        """Mark ``ranks`` on their tracks as still running the call when it ended (``why``): the stuck ones."""
        end = now_us()
        for rank in ranks:
            track = f"{self.label} rank {rank}"
            self._slice(track, f"{self.name} (unfinished: {why})", self.submitted, end, "stuck", rank=rank)

    @contextlib.contextmanager
    def collecting(self) -> Iterator[None]:
        start = now_us()
        try:
            yield
        finally:
            self._slice("driver", f"{self.name} collect", start, now_us(), "collect")

    def _slice(self, track: str, title: str, start: float, end: float, phase: str, **extra: Any) -> None:
        self.tracer.slice(track, title, start, end, phase=phase, method=self.name, call=self.call_id, **extra)
