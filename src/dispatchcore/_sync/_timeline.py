"""One transfer's timeline: its phase times for ``TransferReport.phases`` and, inside a trace block, its slices.

The driver track gets the transfer and its driver phases (``plan``,
``buckets``, ``verify``, ``commit``); each rank's track gets one slice per
bucket and phase (``pack`` on a source rank, ``move`` and ``apply`` on a
destination rank), from the times the ranks return with each step.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

from .._trace import active_tracer, now_us
from ._steps import Side


class Timeline:
    """Seconds per phase (rank phases summed over ranks and buckets), and trace slices where a trace is open."""

    def __init__(self, title: str) -> None:
        self.title = title
        self.tracer = active_tracer()
        self.started = now_us()
        self.phases: dict[str, float] = {}

    @contextlib.contextmanager
    def driver(self, phase: str) -> Iterator[None]:
        """Time a driver phase (and slice it on the driver track)."""
        start = now_us()
        try:
            yield
        finally:
            end = now_us()
            self.phases[phase] = self.phases.get(phase, 0.0) + (end - start) / 1e6
            if self.tracer is not None:
                self.tracer.slice("driver", f"WeightSync {phase}", start, end, phase=f"weight_sync {phase}")

    def ranks(self, side: Side, positions: Sequence[int], spans: Sequence[Sequence[Any]]) -> None:
        """Add what ranks ``positions`` of ``side`` report: ``(phase, bucket, start µs, end µs)`` each."""
        for position, mine in zip(positions, spans, strict=True):
            rank = side.ranks[position]
            for phase, bucket, start, end in mine:
                self.phases[phase] = self.phases.get(phase, 0.0) + (end - start) / 1e6
                if self.tracer is not None:
                    title = f"WeightSync {phase} bucket {bucket}"
                    self.tracer.slice(f"{side.track} rank {rank}", title, start, end, phase=phase, bucket=bucket)

    def close(self, **args: Any) -> None:
        """The whole transfer's slice on the driver track."""
        if self.tracer is not None:
            self.tracer.slice("driver", self.title, self.started, now_us(), phase="weight_sync", **args)
