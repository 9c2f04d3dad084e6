"""Local executor against its floor, measured in the same process.

Floors: a hand-written round trip to N dedicated threads (queue + latch),
and for DP echo ``torch.chunk`` + that round trip + ``torch.cat`` into a
preallocated tensor reused across repeats; "fresh output" concatenates into
a new tensor each time, as a call that returns a batch must (large fresh
allocations page-fault); "floor + copy" also clones each chunk on its
thread, which is the copy isolation needs.  Run: ``python benchmarks/bench_local.py [--quick]``.
"""

from __future__ import annotations

import argparse
import queue
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import PAYLOADS, median_ms, print_table, repeats_for  # noqa: E402
from dispatchcore import DataProto, Dispatch, Worker, WorkerGroup, register  # noqa: E402


class Bench(Worker):
    @register(Dispatch.ONE_TO_ALL)
    def empty(self) -> None:
        return None

    @register(Dispatch.DP_COMPUTE_PROTO)
    def echo(self, data: DataProto) -> DataProto:
        return data


class ThreadFloor:
    """N threads, one queue each, one latch per round: the least a thread pool can do."""

    def __init__(self, n: int) -> None:
        self.queues: list[queue.SimpleQueue[Any]] = [queue.SimpleQueue() for _ in range(n)]
        self.threads = [threading.Thread(target=self._serve, args=(q,), daemon=True) for q in self.queues]
        for t in self.threads:
            t.start()

    @staticmethod
    def _serve(q: queue.SimpleQueue[Any]) -> None:
        while (task := q.get()) is not None:
            task()

    def run(self, fns: Sequence[Callable[[], Any]]) -> list[Any]:
        results: list[Any] = [None] * len(fns)
        pending = [len(fns)]
        lock, done = threading.Lock(), threading.Event()

        def wrap(i: int, fn: Callable[[], Any]) -> Callable[[], None]:
            def task() -> None:
                results[i] = fn()
                with lock:
                    pending[0] -= 1
                    if pending[0] == 0:
                        done.set()

            return task

        for i, (q, fn) in enumerate(zip(self.queues, fns, strict=True)):
            q.put(wrap(i, fn))
        done.wait()
        return results

    def close(self) -> None:
        for q in self.queues:
            q.put(None)
        for t in self.threads:
            t.join()


def measure(sizes: Sequence[int], labels: Sequence[str], quick: bool) -> list[list[object]]:
    rows: list[list[object]] = []
    for n in sizes:
        floor = ThreadFloor(n)
        wg = WorkerGroup(Bench, n)
        shared = WorkerGroup(Bench, n, isolate=False)
        reps = 50 if quick else 300
        f = median_ms(lambda: floor.run([lambda: None] * n), reps)
        d = median_ms(wg.empty, reps)
        e = median_ms(shared.empty, reps)
        rows.append([n, "empty call", f"{f:.3f}", "", "", f"{d:.3f}", f"{d / f:.2f}", f"{e:.3f}", f"{e / f:.2f}", ""])
        for label in labels:
            x = torch.arange(1024 * PAYLOADS[label], dtype=torch.int64).reshape(1024, -1)
            data = DataProto.from_dict({"input_ids": x})
            out = torch.empty_like(x)
            reps = repeats_for(label, quick)

            def floor_echo(copy: bool, fresh: bool = False, x: torch.Tensor = x, out: torch.Tensor = out) -> None:
                chunks = torch.chunk(x, n)
                results = floor.run([(lambda c=c: c.clone()) if copy else (lambda c=c: c) for c in chunks])
                if fresh:
                    torch.cat(results)
                else:
                    torch.cat(results, out=out)

            f0 = median_ms(lambda: floor_echo(False), reps)
            f0_fresh = median_ms(lambda: floor_echo(False, fresh=True), reps)
            f1 = median_ms(lambda: floor_echo(True), reps)
            iso = median_ms(lambda: wg.echo(data), reps)
            raw = median_ms(lambda: shared.echo(data), reps)
            rows.append(
                [
                    n,
                    f"DP echo {label}",
                    f"{f0:.2f}",
                    f"{f0_fresh:.2f}",
                    f"{f1:.2f}",
                    f"{iso:.2f}",
                    f"{iso / f1:.2f}",
                    f"{raw:.2f}",
                    f"{raw / f0:.2f}",
                    f"{raw / f0_fresh:.2f}",
                ]
            )
        wg.shutdown()
        shared.shutdown()
        floor.close()
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer repeats, N=2 and N=4, up to 1 MB")
    args = parser.parse_args(argv)
    labels = ["8KB", "1MB"] if args.quick else ["8KB", "1MB", "64MB"]
    rows = measure([2, 4], labels, args.quick)
    print_table(
        f"local executor vs floor (median ms{', quick' if args.quick else ''}; ratio = ours / floor)",
        [
            "N",
            "case",
            "floor",
            "floor, fresh output",
            "floor+copy",
            "isolated",
            "isolated / floor+copy (≤1.3; empty: / floor ≤1.5)",
            "isolate=False",
            "/ floor (≤1.3)",
            "/ floor, fresh output",
        ],
        rows,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
