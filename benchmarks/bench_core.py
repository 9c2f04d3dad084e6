"""The core's own per-call cost: dispatch + collect with a null executor, per mode, N = 1..64.

The null executor answers every call at once with each rank's first
argument (an echo) and moves nothing, so what is timed is the driver-side
work every backend pays: binding, the call context, dispatch (split, pad),
the ``Call``, the handle and collect (concat, trim).  Floors in the same run:

* ``loop``: a plain Python loop calling a function once per rank (what any
  fan-out costs at least);
* ``chunk+cat``: ``torch.chunk`` of the batch's tensor and ``torch.cat`` of
  the pieces (the least a DP split and join can do).

    python benchmarks/bench_core.py            # N = 1, 2, 4, ..., 64
    python benchmarks/bench_core.py --quick
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import torch

from dispatchcore import DataProto, Dispatch, Worker, WorkerGroup, register
from dispatchcore.executor import Call, CallHandle, Executor, register_executor


class _Answered(CallHandle):
    def __init__(self, call: Call) -> None:
        self._results = [args[0] if args else None for args in call.args]

    def result(self, timeout: float | None = None) -> list[Any]:
        return self._results

    def done(self) -> bool:
        return True


class NullExecutor(Executor):
    """Backend ``"null"``: no ranks; each call returns every rank's first argument."""

    name = "null"

    def submit(self, call: Call) -> CallHandle:
        return _Answered(call)

    def shutdown(self) -> None:
        pass


class Echo(Worker):
    @register(Dispatch.ONE_TO_ALL)
    def empty(self) -> None: ...

    @register(Dispatch.ONE_TO_ALL)
    def one_to_all(self, value: Any) -> Any:
        return value

    @register(Dispatch.RANK_ZERO)
    def rank_zero(self, value: Any) -> Any:
        return value

    @register(Dispatch.DP_COMPUTE_PROTO)
    def dp_echo(self, data: DataProto) -> DataProto:
        return data

    @register(Dispatch.DP_COMPUTE_METRIC)
    def metric(self, data: DataProto) -> Any:
        return data


def per_call_us(fn: Any, calls: int, repeats: int) -> float:
    """Median over ``repeats`` of the mean time of one call in a batch of ``calls`` (µs)."""
    fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - start) / calls * 1e6)
    samples.sort()
    return samples[len(samples) // 2]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1,2,4,8,16,32,64", help="world sizes")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    register_executor(NullExecutor)
    calls, repeats = (200, 5) if args.quick else (1000, 9)

    def noop(_: int) -> None:
        return None

    print(f"\n### Core per-call cost, null executor (µs per call; median of {repeats} batches of {calls})\n")
    print(
        "| N | loop floor | empty ONE_TO_ALL | ratio | ONE_TO_ALL(x) | RANK_ZERO(x) "
        "| chunk+cat floor | DP_COMPUTE_PROTO echo | ratio | DP_COMPUTE_METRIC | µs/rank (empty) |"
    )
    print("| --- " * 11 + "|")
    for n in [int(s) for s in args.sizes.split(",")]:
        rows = 4 * n
        tensor = torch.arange(rows * 8, dtype=torch.float32).reshape(rows, 8)
        batch = DataProto.from_dict({"x": tensor})
        with WorkerGroup(Echo, n, backend="null") as wg:
            loop = per_call_us(lambda: [noop(r) for r in range(n)], calls, repeats)
            empty = per_call_us(wg.empty, calls, repeats)
            one = per_call_us(lambda: wg.one_to_all(1), calls, repeats)
            zero = per_call_us(lambda: wg.rank_zero(1), calls, repeats)
            floor = per_call_us(lambda: torch.cat(torch.chunk(tensor, n)), calls, repeats)
            dp = per_call_us(lambda: wg.dp_echo(batch), calls, repeats)
            metric = per_call_us(lambda: wg.metric(batch), calls, repeats)
        print(
            f"| {n} | {loop:.1f} | {empty:.1f} | {empty / loop:.0f}x | {one:.1f} | {zero:.1f} | {floor:.1f} "
            f"| {dp:.1f} | {dp / floor:.1f}x | {metric:.1f} | {empty / n:.1f} |"
        )


if __name__ == "__main__":
    main()
