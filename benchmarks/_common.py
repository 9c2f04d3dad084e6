"""Shared benchmark helpers: medians of repeats and a markdown ratio table."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence

PAYLOADS = {"8KB": 1, "1MB": 128, "64MB": 8192, "256MB": 32768}  # int64 [1024, L]


def median_ms(fn: Callable[[], object], repeats: int, warmup: int = 2) -> float:
    """Median wall time of ``fn`` in milliseconds after ``warmup`` runs."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def repeats_for(label: str, quick: bool) -> int:
    big = label in ("64MB", "256MB")
    if quick:
        return 3 if big else 20
    return 7 if big else 100


def print_table(title: str, header: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    print(f"\n### {title}\n")
    print("| " + " | ".join(header) + " |")
    print("| " + " | ".join("---" for _ in header) + " |")
    for row in rows:
        cells = [
            f"{c:.3f}" if isinstance(c, float) and c < 1 else f"{c:.2f}" if isinstance(c, float) else str(c)
            for c in row
        ]
        print("| " + " | ".join(cells) + " |")
