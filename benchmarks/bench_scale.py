"""Many ranks on one machine: how the driver's cost per call grows with N, per backend.

    python benchmarks/bench_scale.py --backend local --ranks 2 8 32 128 256
    python benchmarks/bench_scale.py --backend torchrun --ranks 2 4 8 16 32
    python benchmarks/bench_scale.py --backend ray --ranks 2 4 8 16 32

Per N: group start-up (wall seconds), the driver's CPU time per call
(``time.process_time`` around batches of calls: every thread of the driver
process, so Ray's and the hub's background threads count; wall time on a
shared 2-core machine mostly measures oversubscription) and per rank, the
calling thread's own CPU per call (``time.thread_time``: the serial part of
the fan-out), and the start skew of one call (every rank records
``time.time()`` at method entry; max - min, and the last entry after the
driver's call began; one machine, one clock).  Cases: an empty
``ONE_TO_ALL`` call and a ``DP_COMPUTE_PROTO`` echo of an int64 [1024, 1]
batch (8 KB).  Floors, measured the same way in the same run: a plain loop
over N threads (local), raw ``ray.get([a.f.remote() for a in actors])``
(ray), a TCPStore round trip per rank to N helper processes (torchrun).  Each
N also reports the driver's OS threads and open file descriptors the group
added.  Prints markdown tables and a least-squares fit ``a + b*N``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pickle
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_local import ThreadFloor  # noqa: E402
from dispatchcore import DataProto, Dispatch, Worker, WorkerGroup, register  # noqa: E402

DEFAULT_RANKS = {"local": [2, 8, 32, 128, 256], "torchrun": [2, 4, 8, 16, 32], "ray": [2, 4, 8, 16, 32]}
ROWS = 1024
#: How long each rank sleeps in the idle-wait case (several liveness polls).
NAP_S = 3.0


class ScaleWorker(Worker):
    @register(Dispatch.ONE_TO_ALL)
    def empty(self) -> None:
        return None

    @register(Dispatch.ONE_TO_ALL)
    def stamp(self) -> float:
        return time.time()

    @register(Dispatch.ONE_TO_ALL)
    def nap(self, seconds: float) -> None:
        time.sleep(seconds)

    @register(Dispatch.DP_COMPUTE_PROTO)
    def echo(self, data: DataProto) -> DataProto:
        return data

    @register(Dispatch.DP_COMPUTE_PROTO)
    def dp_stamp(self, data: DataProto) -> DataProto:
        entered = time.time()
        return DataProto.from_dict({"t": torch.full((len(data),), entered, dtype=torch.float64)})


# -- measuring -------------------------------------------------------------------------------
@dataclass
class Cost:
    """One case at one N: medians over batches (ms per call)."""

    cpu_ms: float
    thread_ms: float
    wall_ms: float


@dataclass
class Skew:
    spread_ms: float
    last_ms: float


@dataclass
class Row:
    n: int
    case: str
    ours: Cost
    floor: Cost | None
    skew: Skew | None = None
    floor_skew: Skew | None = None


@dataclass
class Scale:
    """Everything measured at one N."""

    n: int
    startup_s: float
    floor_startup_s: float | None
    threads: int
    fds: int
    rows: list[Row] = field(default_factory=list)
    #: Driver CPU (ms) per second of a call in which every rank sleeps (liveness checks, polling).
    idle_ms_per_s: float = 0.0

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @staticmethod
    def from_json(line: str) -> Scale:
        raw = json.loads(line)

        def opt(cls: Any, value: Any) -> Any:
            return None if value is None else cls(**value)

        rows = [
            Row(
                r["n"],
                r["case"],
                Cost(**r["ours"]),
                opt(Cost, r["floor"]),
                opt(Skew, r["skew"]),
                opt(Skew, r["floor_skew"]),
            )
            for r in raw.pop("rows")
        ]
        return Scale(**raw, rows=rows)


def cost(fn: Callable[[], Any], calls: int, batches: int, warmup: int = 3) -> Cost:
    for _ in range(warmup):
        fn()
    cpu, thread, wall = [], [], []
    for _ in range(batches):
        p0, t0, w0 = time.process_time(), time.thread_time(), time.perf_counter()
        for _ in range(calls):
            fn()
        cpu.append((time.process_time() - p0) / calls)
        thread.append((time.thread_time() - t0) / calls)
        wall.append((time.perf_counter() - w0) / calls)
    return Cost(statistics.median(cpu) * 1e3, statistics.median(thread) * 1e3, statistics.median(wall) * 1e3)


def skew(fn: Callable[[], Sequence[float]], repeats: int) -> Skew:
    """``fn`` returns every rank's entry time for one call."""
    fn()
    spreads, lasts = [], []
    for _ in range(repeats):
        began = time.time()
        stamps = fn()
        spreads.append(max(stamps) - min(stamps))
        lasts.append(max(stamps) - began)
    return Skew(statistics.median(spreads) * 1e3, statistics.median(lasts) * 1e3)


def os_threads() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    return threading.active_count()


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def batch_for(n: int) -> tuple[torch.Tensor, DataProto]:
    rows = n * math.ceil(ROWS / n)
    x = torch.arange(rows, dtype=torch.int64).reshape(rows, 1)
    return x, DataProto.from_dict({"input_ids": x})


def stamps_of(data: DataProto) -> list[float]:
    return data.batch["t"].tolist()


def measure_group(wg: WorkerGroup[Any], n: int, calls: int, batches: int, repeats: int) -> dict[str, Any]:
    _, data = batch_for(n)
    return {
        "empty": cost(wg.empty, calls, batches),
        "echo": cost(lambda: wg.echo(data), calls, batches),
        "stamp": skew(wg.stamp, repeats),
        "dp_stamp": skew(lambda: stamps_of(wg.dp_stamp(data)), repeats),
        "idle": idle_cost(wg),
    }


def idle_cost(wg: WorkerGroup[Any]) -> float:
    """Driver CPU ms per second of one call in which every rank sleeps ``NAP_S``."""
    p0, w0 = time.process_time(), time.perf_counter()
    wg.nap(NAP_S)
    return (time.process_time() - p0) * 1e3 / (time.perf_counter() - w0)


def start_group(n: int, backend: str) -> tuple[WorkerGroup[Any], float, int, int]:
    threads, fds = os_threads(), open_fds()
    t0 = time.perf_counter()
    wg = WorkerGroup(ScaleWorker, n, backend=backend)
    wg.empty()
    startup = time.perf_counter() - t0
    return wg, startup, os_threads() - threads, open_fds() - fds


def rows_from(n: int, ours: dict[str, Any], floor: dict[str, Any] | None) -> list[Row]:
    return [
        Row(n, "empty ONE_TO_ALL", ours["empty"], floor and floor["empty"], ours["stamp"], floor and floor["stamp"]),
        Row(n, "DP echo 8 KB", ours["echo"], floor and floor["echo"], ours["dp_stamp"], floor and floor["dp_stamp"]),
    ]


# -- local -------------------------------------------------------------------------------------
def run_local(n: int, calls: int, batches: int, repeats: int) -> Scale:
    t0 = time.perf_counter()
    floor = ThreadFloor(n)
    floor_startup = time.perf_counter() - t0
    x, _ = batch_for(n)
    noops: list[Callable[[], Any]] = [lambda: None] * n
    clocks: list[Callable[[], Any]] = [time.time] * n

    def floor_echo() -> torch.Tensor:
        return torch.cat(floor.run([lambda c=c: c for c in torch.chunk(x, n)]))

    def floor_dp_stamp() -> list[float]:
        parts = floor.run(
            [lambda c=c: torch.full((len(c),), time.time(), dtype=torch.float64) for c in torch.chunk(x, n)]
        )
        return torch.cat(parts).tolist()

    try:
        floor_results = {
            "empty": cost(lambda: floor.run(noops), calls, batches),
            "echo": cost(floor_echo, calls, batches),
            "stamp": skew(lambda: floor.run(clocks), repeats),
            "dp_stamp": skew(floor_dp_stamp, repeats),
        }
    finally:
        floor.close()
    wg, startup, threads, fds = start_group(n, "local")
    try:
        ours = measure_group(wg, n, calls, batches, repeats)
    finally:
        wg.shutdown()
    scale = Scale(n, startup, floor_startup, threads, fds)
    scale.rows = rows_from(n, ours, floor_results)
    scale.idle_ms_per_s = ours["idle"]
    return scale


# -- ray ---------------------------------------------------------------------------------------
class RawActor:
    """What hand-written Ray runs (no dispatchcore, no torch)."""

    def noop(self) -> None:
        return None

    def stamp(self) -> float:
        return time.time()

    def echo(self, x: np.ndarray) -> np.ndarray:
        return x

    def dp_stamp(self, x: np.ndarray) -> np.ndarray:
        return np.full((len(x),), time.time())


def run_ray(ray: Any, n: int, calls: int, batches: int, repeats: int) -> Scale:
    x, _ = batch_for(n)
    t0 = time.perf_counter()
    cls = ray.remote(num_cpus=0)(RawActor)
    actors = [cls.remote() for _ in range(n)]
    ray.get([a.noop.remote() for a in actors])
    floor_startup = time.perf_counter() - t0

    def floor_echo() -> np.ndarray:
        parts = np.array_split(x.numpy(), n)
        return np.concatenate(ray.get([a.echo.remote(p) for a, p in zip(actors, parts, strict=True)]))

    def floor_dp_stamp() -> list[float]:
        parts = np.array_split(x.numpy(), n)
        return np.concatenate(ray.get([a.dp_stamp.remote(p) for a, p in zip(actors, parts, strict=True)])).tolist()

    try:
        floor_results = {
            "empty": cost(lambda: ray.get([a.noop.remote() for a in actors]), calls, batches),
            "echo": cost(floor_echo, calls, batches),
            "stamp": skew(lambda: ray.get([a.stamp.remote() for a in actors]), repeats),
            "dp_stamp": skew(floor_dp_stamp, repeats),
        }
    finally:
        for a in actors:
            ray.kill(a)
        actors.clear()
    wg, startup, threads, fds = start_group(n, "ray")
    try:
        ours = measure_group(wg, n, calls, batches, repeats)
    finally:
        wg.shutdown()
    scale = Scale(n, startup, floor_startup, threads, fds)
    scale.rows = rows_from(n, ours, floor_results)
    scale.idle_ms_per_s = ours["idle"]
    return scale


# -- torchrun ----------------------------------------------------------------------------------
def _store_helper(port: int, rank: int) -> None:
    """A floor rank: pop a command from the store, answer it, until told to stop."""
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", port, None, False, timedelta(seconds=600))
    store.add("ready", 1)
    while True:
        try:
            message = store.queue_pop(f"cmd/{rank}", True)
        except dist.QueueEmptyError:
            continue
        kind, body = message[:1], message[1:]
        if kind == b"q":
            return
        if kind == b"p":  # ping
            store.queue_push(f"st/{rank}", b"")
        elif kind == b"t":  # stamp
            store.queue_push(f"st/{rank}", pickle.dumps(time.time()))
        elif kind == b"e":  # echo the chunk's bytes
            store.queue_push(f"st/{rank}", body)
        elif kind == b"s":  # one entry time per row of the chunk
            rows = len(pickle.loads(body))  # noqa: S301 - our own helper's bytes
            store.queue_push(f"st/{rank}", pickle.dumps(np.full((rows,), time.time())))


class StoreFloor:
    """N helper processes, one store queue each way: the least the torchrun hub can do per rank."""

    def __init__(self, n: int) -> None:
        import torch.distributed as dist

        self.dist = dist
        self.n = n
        self.store = dist.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=600), wait_for_workers=False)
        script = os.path.abspath(__file__)
        self.procs = [
            subprocess.Popen([sys.executable, script, "--store-helper", str(self.store.port), str(r)]) for r in range(n)
        ]
        deadline = time.monotonic() + 600
        while int(self.store.add("ready", 0)) < n:
            if time.monotonic() > deadline or any(p.poll() is not None for p in self.procs):
                raise RuntimeError("store floor helpers did not start")
            time.sleep(0.02)

    def _pop(self, rank: int) -> bytes:
        while True:
            try:
                return self.store.queue_pop(f"st/{rank}", True)
            except self.dist.QueueEmptyError:
                continue

    def round_trip(self, messages: Sequence[bytes]) -> list[bytes]:
        for r, message in enumerate(messages):
            self.store.queue_push(f"cmd/{r}", message)
        return [self._pop(r) for r in range(self.n)]

    def close(self) -> None:
        for r in range(self.n):
            self.store.queue_push(f"cmd/{r}", b"q")
        deadline = time.monotonic() + 30
        for p in self.procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def run_torchrun(n: int, calls: int, batches: int, repeats: int) -> Scale:
    x, _ = batch_for(n)
    t0 = time.perf_counter()
    floor = StoreFloor(n)
    floor_startup = time.perf_counter() - t0

    def floor_echo() -> np.ndarray:
        parts = np.array_split(x.numpy(), n)
        replies = floor.round_trip([b"e" + pickle.dumps(p, protocol=5) for p in parts])
        return np.concatenate([pickle.loads(r) for r in replies])  # noqa: S301

    def floor_dp_stamp() -> list[float]:
        parts = np.array_split(x.numpy(), n)
        replies = floor.round_trip([b"s" + pickle.dumps(p, protocol=5) for p in parts])
        return np.concatenate([pickle.loads(r) for r in replies]).tolist()  # noqa: S301

    try:
        floor_results = {
            "empty": cost(lambda: floor.round_trip([b"p"] * n), calls, batches),
            "echo": cost(floor_echo, calls, batches),
            "stamp": skew(lambda: [pickle.loads(r) for r in floor.round_trip([b"t"] * n)], repeats),  # noqa: S301
            "dp_stamp": skew(floor_dp_stamp, repeats),
        }
    finally:
        floor.close()
    wg, startup, threads, fds = start_group(n, "torchrun")
    try:
        ours = measure_group(wg, n, calls, batches, repeats)
    finally:
        wg.shutdown()
    scale = Scale(n, startup, floor_startup, threads, fds)
    scale.rows = rows_from(n, ours, floor_results)
    scale.idle_ms_per_s = ours["idle"]
    return scale


# -- report ------------------------------------------------------------------------------------
FLOORS = {
    "local": "a plain loop over N threads (a queue each, one latch)",
    "torchrun": "a TCPStore push + pop per rank, N helper processes",
    "ray": "ray.get([a.f.remote() for a in actors]), numpy chunks",
}


def fit(points: Sequence[tuple[int, float]]) -> tuple[float, float]:
    """``a + b*N`` by least squares on relative error (each N counts alike): a fixed ms, b ms per rank."""
    if len(points) < 2:
        return points[0][1], 0.0
    w = [1.0 / (y * y) for _, y in points]
    sw = sum(w)
    sn = sum(wi * n for wi, (n, _) in zip(w, points, strict=True))
    sy = sum(wi * y for wi, (_, y) in zip(w, points, strict=True))
    snn = sum(wi * n * n for wi, (n, _) in zip(w, points, strict=True))
    sny = sum(wi * n * y for wi, (n, y) in zip(w, points, strict=True))
    b = (sw * sny - sn * sy) / (sw * snn - sn * sn)
    return (sy - b * sn) / sw, b


def report(backend: str, scales: list[Scale]) -> str:
    scales = sorted(scales, key=lambda s: s.n)
    lines = [
        f"\n### {backend}: driver cost per call (floor: {FLOORS[backend]})\n",
        "| N | case | driver CPU/call (ms) | per rank (µs) | calling thread CPU/call (ms) | floor CPU/call (ms) "
        "| ratio | floor per rank (µs) | wall/call (ms) | skew max-min (ms) | last rank start (ms) "
        "| floor skew (ms) |",
        "|" + " --- |" * 12,
    ]
    for s in scales:
        for r in s.rows:
            f = r.floor
            floor_cells = (
                f"{f.cpu_ms:.3f} | {r.ours.cpu_ms / f.cpu_ms:.2f}x | {f.cpu_ms / s.n * 1e3:.1f}" if f else "- | - | -"
            )
            sk = f"{r.skew.spread_ms:.2f} | {r.skew.last_ms:.2f}" if r.skew else "- | -"
            fsk = f"{r.floor_skew.spread_ms:.2f}" if r.floor_skew else "-"
            lines.append(
                f"| {s.n} | {r.case} | {r.ours.cpu_ms:.3f} | {r.ours.cpu_ms / s.n * 1e3:.1f} | {r.ours.thread_ms:.3f} "
                f"| {floor_cells} | {r.ours.wall_ms:.2f} | {sk} | {fsk} |"
            )
    lines += [
        "",
        "| N | start-up (s) | floor start-up (s) | driver OS threads added | driver fds added "
        "| driver CPU while ranks sleep (ms/s) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for s in scales:
        fs = f"{s.floor_startup_s:.2f}" if s.floor_startup_s is not None else "-"
        lines.append(f"| {s.n} | {s.startup_s:.2f} | {fs} | {s.threads} | {s.fds} | {s.idle_ms_per_s:.1f} |")
    lines += ["", "Fit a + b·N (least squares on relative error) and per-rank cost at each N:", ""]
    picks: list[tuple[str, Callable[[Row], Cost | None]]] = [
        ("driver CPU", lambda r: r.ours),
        ("calling thread CPU", lambda r: Cost(r.ours.thread_ms, 0.0, 0.0)),
        ("floor CPU", lambda r: r.floor),
    ]
    for case in [r.case for r in scales[0].rows]:
        for label, pick in picks:
            points = [(s.n, c.cpu_ms) for s in scales for r in s.rows if r.case == case and (c := pick(r))]
            if not points:
                continue
            a, b = fit(points)
            per_rank = " → ".join(f"{y / n * 1e3:.0f}" for n, y in points)
            lines.append(
                f"- {case}, {label}: a = {a:.3f} ms, b = {b * 1e3:.1f} µs/rank; "
                f"per rank, N={points[0][0]}..{points[-1][0]}: {per_rank} µs"
            )
    return "\n".join(lines)


def run_backend(backend: str, ranks: Sequence[int], args: argparse.Namespace) -> list[Scale]:
    scales: list[Scale] = []
    ray: Any = None
    started = False
    if backend == "ray":
        import ray

        if __name__ != "__main__":  # imported (not run): ship this module's classes by value
            import cloudpickle
            from ray import cloudpickle as ray_cloudpickle

            for pickler in (cloudpickle, ray_cloudpickle):
                pickler.register_pickle_by_value(sys.modules[__name__])
        started = not ray.is_initialized()
        if started:
            ray.init(num_cpus=args.num_cpus, include_dashboard=False, log_to_driver=False)
    try:
        for n in ranks:
            if backend == "local":
                scale = run_local(n, args.calls, args.batches, args.repeats)
            elif backend == "torchrun":
                scale = run_torchrun(n, args.calls, args.batches, args.repeats)
            else:
                scale = run_ray(ray, n, args.calls, args.batches, args.repeats)
            scales.append(scale)
            if args.out:
                with open(args.out, "a") as out:
                    out.write(json.dumps({"backend": backend, "scale": json.loads(scale.to_json())}) + "\n")
            print(f"{backend} N={n} done (load {os.getloadavg()[0]:.1f})", file=sys.stderr, flush=True)
    finally:
        if started:
            ray.shutdown()
    return scales


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=list(DEFAULT_RANKS), action="append", help="default: all three")
    parser.add_argument("--ranks", type=int, nargs="+", help="group sizes (default: local 2..256, others 2..32)")
    parser.add_argument("--calls", type=int, default=20, help="calls per timed batch")
    parser.add_argument("--batches", type=int, default=5, help="timed batches per case (the median is reported)")
    parser.add_argument("--repeats", type=int, default=20, help="calls per skew median")
    parser.add_argument("--quick", action="store_true", help="N=2 and N=8 only, fewer repeats")
    parser.add_argument("--num-cpus", type=int, default=4, help="CPUs of the local Ray the benchmark starts")
    parser.add_argument("--out", help="append each N's figures to this JSON-lines file as it finishes")
    parser.add_argument("--report-from", nargs="+", metavar="JSONL", help="print the tables from saved --out files")
    parser.add_argument("--store-helper", nargs=2, type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.store_helper:
        _store_helper(*args.store_helper)
        return 0
    if args.report_from:
        saved: dict[str, dict[int, Scale]] = {}
        for path in args.report_from:
            with open(path) as f:
                for line in f:
                    entry = json.loads(line)
                    scale = Scale.from_json(json.dumps(entry["scale"]))
                    saved.setdefault(entry["backend"], {})[scale.n] = scale  # a later run of an N wins
        for backend, by_n in saved.items():
            print(report(backend, list(by_n.values())))
        return 0
    if args.quick:
        args.calls, args.batches, args.repeats = 10, 3, 10
    load = os.getloadavg()
    print(
        f"bench_scale {time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} CPUs, load average "
        f"{load[0]:.1f}/{load[1]:.1f}/{load[2]:.1f}; medians of {args.batches} batches of {args.calls} calls; "
        "CPU = time.process_time of the whole driver process",
        flush=True,
    )
    for backend in args.backend or list(DEFAULT_RANKS):
        ranks = args.ranks or ([2, 8] if args.quick else DEFAULT_RANKS[backend])
        print(report(backend, run_backend(backend, ranks, args)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
