"""Benchmark of the torchrun executor against the floor measured in the same run.

    python benchmarks/bench_torchrun.py --quick                  # self-started ranks, N=2 and N=4
    torchrun --standalone --nproc-per-node=4 benchmarks/bench_torchrun.py --quick

Cases (payload: int64 ``input_ids`` of shape [1024, L]): an empty call to
every rank; DP echo (``DP_COMPUTE_PROTO`` returning its chunk) of 8 KB, 1 MB,
64 MB, 256 MB; large-in/tiny-out (each rank returns one number per row).
Floors, measured by helper processes on a gloo group and store of their own:
a store round trip to every rank (push a message on each rank's queue, each
rank pops it and pushes a reply, the driver pops every reply) for the empty
call, and raw ``send``/``recv`` of the same ``tensor_split`` slices into
preallocated buffers (both ways, or in plus one number per row) for the rest.
That floor reuses its buffers and output across repeats, which the executor
cannot; "floor + fresh output" repeats it with new (numpy) memory per call on
the helpers and for the output, the same work the executor does.
Prints medians and ratios as a markdown table.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import median_ms
from dispatchcore import DataProto, Dispatch, Worker, WorkerGroup, register

ROWS = 1024
SIZES = {"8 KB": 1, "1 MB": 128, "64 MB": 8192, "256 MB": 32768}


class BenchWorker(Worker):
    @register(Dispatch.ONE_TO_ALL)
    def empty(self) -> None:
        return None

    @register(Dispatch.DP_COMPUTE_PROTO)
    def echo(self, data: DataProto) -> DataProto:
        return data

    @register(Dispatch.DP_COMPUTE_PROTO)
    def count(self, data: DataProto) -> DataProto:
        return DataProto.from_dict({"n": data.batch["input_ids"][:, 0].clone()})


# -- floor: helper processes on a raw gloo group ------------------------------------------
def fresh_tensor(shape: tuple[int, ...]) -> torch.Tensor:
    """New int64 memory from numpy (huge pages), as the executor allocates its buffers."""
    numel = int(torch.Size(shape).numel())
    return torch.from_numpy(np.empty(numel, dtype=np.int64)).reshape(shape)


def pop(store: dist.Store, key: str) -> bytes:
    """A blocking queue pop; retried when the store wakes it with the queue still empty.

    (A blocking ``queue_pop`` was seen to raise ``QueueEmptyError`` about once in a
    few hundred pings: its wait returned before the item was there.)
    """
    while True:
        try:
            return store.queue_pop(key, True)
        except dist.QueueEmptyError:
            continue


def _helper(port: int, rank: int, size: int) -> None:
    """A floor rank: answer store pings and echo / count tensors until told to stop."""
    store = dist.PrefixStore("floor/", dist.TCPStore("127.0.0.1", port, None, False, timedelta(seconds=600)))
    pg = dist.ProcessGroupGloo(dist.PrefixStore("gloo/", store), rank, size, timedelta(seconds=600))
    buffers: dict[tuple[int, ...], torch.Tensor] = {}
    while True:
        command = pop(store, f"cmd/{rank}").decode()
        if command.startswith("stop"):
            break
        kind, fresh, *dims = command.split()
        if kind == "ping":
            store.queue_push(f"st/{rank}", b"pong")
            continue
        shape = tuple(int(d) for d in dims)
        buf = buffers.get(shape)
        if fresh == "1":
            buf = fresh_tensor(shape)
        elif buf is None:
            buf = buffers[shape] = torch.empty(shape, dtype=torch.int64)
        pg.recv([buf], 0, 1).wait()
        out = buf if kind == "echo" else buf[:, 0].clone()
        pg.send([out], 0, 2).wait()


class Floor:
    """The driver side of the floor: ``n`` helper ranks get the last ``n`` of ``slices`` slices.

    Under torchrun worker 0 is the driver's own thread, so its slice never
    travels: there ``slices = N`` and ``n = N - 1``.
    """

    def __init__(self, n: int, slices: int) -> None:
        self.n = n
        self.slices = slices
        self._master = dist.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=600), wait_for_workers=False)
        self.store = dist.PrefixStore("floor/", self._master)
        script = os.path.abspath(__file__)
        self.procs = [
            subprocess.Popen([sys.executable, script, "--floor-helper", str(self._master.port), str(r), str(n + 1)])
            for r in range(1, n + 1)
        ]
        self.pg = dist.ProcessGroupGloo(dist.PrefixStore("gloo/", self.store), 0, n + 1, timedelta(seconds=600))
        self._out: dict[tuple[int, ...], torch.Tensor] = {}

    def ping(self) -> None:
        for r in range(1, self.n + 1):
            self.store.queue_push(f"cmd/{r}", b"ping 0")
        for r in range(1, self.n + 1):
            pop(self.store, f"st/{r}")

    def transfer(self, x: torch.Tensor, kind: str, fresh: bool = False) -> torch.Tensor:
        """Chunks out, results back into one output; ``fresh``: new memory per call on both sides.

        The plain floor reuses its receive buffers and output across repeats;
        the executor cannot (workers own what they receive, callers own the
        result), so ``fresh=True`` is the same work as the executor's: the
        helpers receive into new memory and the output is new each call
        (numpy-allocated on both sides, as the executor allocates).
        """
        skip = self.slices - self.n
        parts = torch.tensor_split(x, self.slices)[skip:]
        key = (kind, *x.shape)
        shape = x.shape if kind == "echo" else (len(x),)
        out = fresh_tensor(shape) if fresh else self._out.get(key)
        if out is None:
            out = self._out[key] = torch.empty(shape, dtype=x.dtype)
        outs = torch.tensor_split(out, self.slices)[skip:]
        works = []
        for r, part in enumerate(parts, start=1):
            dims = " ".join(map(str, part.shape))
            self.store.queue_push(f"cmd/{r}", f"{kind} {int(fresh)} {dims}".encode())
            works.append(self.pg.send([part], r, 1))
        for r, dst in enumerate(outs, start=1):
            works.append(self.pg.recv([dst], r, 2))
        for work in works:
            work.wait()
        return out

    def close(self) -> None:
        for r in range(1, self.n + 1):
            self.store.queue_push(f"cmd/{r}", b"stop 0")
        for proc in self.procs:
            proc.wait(30)


# -- the run -------------------------------------------------------------------------------
Row = tuple[str, float, float, float | None]


def measure(n: int, quick: bool, under_torchrun: bool) -> list[Row]:
    """Rows of (case, executor ms, floor ms, floor-with-fresh-memory ms) for ``n`` ranks."""
    repeats_small, repeats_big = (20, 3) if quick else (100, 7)
    rows: list[Row] = []
    floor = Floor(n - 1 if under_torchrun else n, n)
    wg = WorkerGroup(BenchWorker, n, backend="torchrun")
    try:
        empty = median_ms(wg.empty, repeats_small * 5)
        rows.append(("empty call", empty, median_ms(floor.ping, repeats_small * 5), None))
        for label, width in SIZES.items():
            x = torch.randint(0, 50_000, (ROWS, width), dtype=torch.int64)
            data = DataProto.from_dict({"input_ids": x})
            repeats = repeats_small if width <= 128 else repeats_big
            for kind, method, case in (("echo", wg.echo, "DP echo"), ("count", wg.count, "large-in/tiny-out")):
                if kind == "count" and label not in ("64 MB", "256 MB"):
                    continue
                ours = median_ms(lambda data=data, method=method: method(data), repeats)
                raw = median_ms(lambda x=x, kind=kind: floor.transfer(x, kind), repeats)
                fresh = median_ms(lambda x=x, kind=kind: floor.transfer(x, kind, fresh=True), repeats)
                rows.append((f"{case} {label}", ours, raw, fresh))
    finally:
        wg.shutdown()
        floor.close()
    return rows


def table(results: dict[int, list[Row]]) -> str:
    lines = [
        "| case | N | torchrun executor (ms) | floor (ms) | ratio | floor + fresh output (ms) | ratio to it |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for n, rows in results.items():
        for case, ours, raw, fresh in rows:
            extra = "| - | - |" if fresh is None else f"| {fresh:.2f} | {ours / fresh:.2f}x |"
            lines.append(f"| {case} | {n} | {ours:.2f} | {raw:.2f} | {ours / raw:.2f}x {extra}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="torchrun executor benchmark")
    parser.add_argument("--quick", action="store_true", help="fewer repeats (under ~2 minutes)")
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4], help="group sizes (self-started only)")
    parser.add_argument("--floor-helper", nargs=3, type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.floor_helper:
        _helper(*args.floor_helper)
        return 0
    under_torchrun = "TORCHELASTIC_RUN_ID" in os.environ
    sizes = [int(os.environ["WORLD_SIZE"])] if under_torchrun else args.ranks
    results = {}
    if under_torchrun and sizes[0] < 2:
        raise SystemExit("run under torchrun with --nproc-per-node >= 2")
    for n in sizes:
        results[n] = measure(n, args.quick, under_torchrun)
    mode = "under torchrun (worker 0 in the driver)" if under_torchrun else "self-started ranks"
    print(f"torchrun executor, {mode}; medians; floors measured in the same run")
    print(
        "floor: the same store round trips / gloo send+recv of the same slices, reusing its receive buffers and "
        "output across repeats; floor + fresh output: new (numpy) memory per call on the helpers and for the "
        "output, as the executor must (workers own their inputs, callers own the result)\n"
    )
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
