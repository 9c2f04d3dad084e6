"""Weight sync (``WeightSync``) against the hand-written floor for the same bytes, in the same run.

Run ``python benchmarks/weight_sync.py [--quick] [--backends local,ray] [--mib 256]``.
A weight set of ``--mib`` MiB in a few hundred tensors of mixed sizes and
dtypes (float32, bfloat16); a trainer group of 2 ranks each holding half of
every tensor (dim-0 shards) and a rollout group of 2 ranks each wanting all
of it, copying every tensor into its preallocated parameters in its
``load_weights`` (as vLLM does).  Floors, between the same ranks:

* local: a plain copy of every shard into each rollout rank's parameters
  (two threads, one per rollout rank, as the ranks are threads);
* ray: raw ``ray.put`` of each trainer rank's shards (uint8 numpy views)
  and, on each rollout actor, ``ray.get`` of both plus the copy into its
  parameters (the copy on receipt that isolation asks for).

* torchrun: raw ``torch.distributed`` point to point between the same four
  processes (a ``ProcessGroupGloo`` the benchmark builds on its own
  loopback store): each trainer rank sends every shard to both rollout
  ranks, which receive straight into their parameters (no copy at all).
  ``--backends torchrun`` self-starts two worlds (one per group); run under
  ``torchrun --standalone --nproc-per-node=4 benchmarks/weight_sync.py
  --backends torchrun`` for two groups in one world (ranks 0-1 and 2-3).

Each backend is measured twice on the same groups: the rollout copying
every tensor into its parameters in ``load_weights`` (as vLLM does), and
the rollout lending its parameters (``weight_buffers``) so the weights land
in place.  Prints seconds, GB/s (weight-set bytes delivered to every
rollout rank per second), floor/ours, bytes through the driver
(``driver_traffic()``) and the peak extra memory of each rank process: its
resident high-water mark over the repeats (reset with Linux ``clear_refs``
just before) less its resident size just before, so buffers the process
kept from earlier transfers (its buffer pool) count only if they grew.  On
``local`` all four ranks share one process: one figure for all of them.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import print_table  # noqa: E402
from dispatchcore import Dispatch, Shard, WeightSync, Worker, WorkerGroup, driver_traffic, register  # noqa: E402

Spec = dict[str, tuple[tuple[int, ...], torch.dtype]]


def weight_set(mib: int) -> Spec:
    """About ``mib`` MiB in ~300 tensors: big matrices, mid-size ones, odd-length vectors."""
    spec: Spec = {}
    target, used, i = mib << 20, 0, 0
    while used < target:
        kind = i % 3
        shape = [(1024 + 2 * (i % 7), 512), (257 + i % 13, 256), (4096 + i % 5,)][kind]
        dtype = torch.float32 if i % 2 else torch.bfloat16
        n = 1
        for d in shape:
            n *= d
        spec[f"layer.{i // 3}.p{kind}"] = (shape, dtype)
        used += n * dtype.itemsize
        i += 1
    return spec


def mem_mark() -> int:
    """Reset this process's resident high-water mark to now (Linux ``clear_refs``); resident bytes now."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return _status("VmRSS")


def mem_peak() -> int:
    """This process's resident high-water mark since the last :func:`mem_mark`, in bytes."""
    return _status("VmHWM")


def _status(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) << 10
    raise KeyError(key)


def half(n: int, rank: int) -> tuple[int, int]:
    mid = (n + 1) // 2
    return (0, mid) if rank == 0 else (mid, n)


class Memory(Worker):
    @register(Dispatch.ONE_TO_ALL)
    def mem_mark(self) -> int:
        return mem_mark()

    @register(Dispatch.ONE_TO_ALL)
    def mem_peak(self) -> int:
        return mem_peak()


class Trainer(Memory):
    def __init__(self, spec: Spec) -> None:
        self.shards = {}
        for name, (shape, dtype) in spec.items():
            lo, hi = half(shape[0], self.rank)
            self.shards[name] = Shard(torch.full((hi - lo, *shape[1:]), float(self.rank + 1), dtype=dtype), lo, shape)

    def weights(self) -> dict[str, Shard]:
        return self.shards

    @register(Dispatch.ONE_TO_ALL)
    def floor_put(self) -> Any:
        import ray

        return ray.put([s.tensor.reshape(-1).view(torch.uint8).numpy() for s in self.shards.values()])

    @register(Dispatch.ONE_TO_ALL, blocking=False)
    def floor_join(self, port: int) -> int:
        return _join(self, port, self.rank)

    @register(Dispatch.ONE_TO_ALL, blocking=False)
    def floor_send(self) -> int:
        works = [
            self.floor.send([s.tensor.reshape(-1)], 2 + peer, i)
            for i, s in enumerate(self.shards.values())
            for peer in range(2)
        ]
        for w in works:
            w.wait()
        return 0


def _join(worker: Any, port: int, rank: int) -> int:
    """The floor's own gloo group of the four ranks (trainers 0-1, rollouts 2-3), on the driver's store."""
    import datetime

    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", port, None, False, datetime.timedelta(seconds=120), wait_for_workers=False)
    options = dist.ProcessGroupGloo._Options()  # type: ignore[attr-defined]
    options._timeout = datetime.timedelta(seconds=300)
    options._devices = [dist.ProcessGroupGloo.create_device(hostname="127.0.0.1")]
    worker.floor = dist.ProcessGroupGloo(dist.PrefixStore("floor/", store), rank, 4, options)
    return 0


class Rollout(Memory):
    def __init__(self, spec: Spec) -> None:
        self.spec = spec
        self.params = {name: torch.zeros(shape, dtype=dtype) for name, (shape, dtype) in spec.items()}

    def load_weights(self, weights: list[tuple[str, torch.Tensor]]) -> None:
        for name, t in weights:
            self.params[name].copy_(t)

    @register(Dispatch.ONE_TO_ALL)
    def checksum(self) -> float:
        return float(sum(p.double().sum() for p in self.params.values()))

    @register(Dispatch.ONE_TO_ALL)
    def floor_get(self, first: Any, second: Any) -> int:
        import ray

        got = [ray.get(x) if isinstance(x, ray.ObjectRef) else x for x in (first, second)]  # Ray may resolve them
        for rank, arrays in enumerate(got):
            for (name, (shape, dtype)), a in zip(self.spec.items(), arrays, strict=True):
                lo, hi = half(shape[0], rank)
                self.params[name][lo:hi].copy_(torch.from_numpy(a).view(dtype).reshape(hi - lo, *shape[1:]))
        return 0

    @register(Dispatch.ONE_TO_ALL, blocking=False)
    def floor_join(self, port: int) -> int:
        return _join(self, port, 2 + self.rank)

    @register(Dispatch.ONE_TO_ALL, blocking=False)
    def floor_recv(self) -> int:
        works = []
        for i, (name, (shape, _)) in enumerate(self.spec.items()):
            for src in range(2):
                lo, hi = half(shape[0], src)
                works.append(self.floor.recv([self.params[name][lo:hi].reshape(-1)], src, i))
        for w in works:
            w.wait()
        return 0

    @register(Dispatch.ONE_TO_ALL)
    def set_lend(self, lend: bool) -> None:
        self.lend = lend

    def weight_buffers(self, shapes: dict[str, Any]) -> dict[str, torch.Tensor]:
        """With ``lend`` on, the parameters themselves: the weights land in place (no copy in ``load_weights``)."""
        return self.params if getattr(self, "lend", False) else {}


def local_floor(spec: Spec, shards: list[dict[str, Shard]], params: list[dict[str, torch.Tensor]]) -> None:
    def one(dest: dict[str, torch.Tensor]) -> None:
        for name in spec:
            for held in shards:
                s = held[name]
                dest[name][s.offset : s.offset + s.tensor.shape[0]].copy_(s.tensor)

    threads = [threading.Thread(target=one, args=(p,)) for p in params]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def timed(fn: Any, repeats: int) -> float:
    fn()  # warm-up: first-touch of buffers, Ray workers' imports
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def torchrun_floor(src: Any, dst: Any, repeats: int) -> float:
    """Raw point to point between the same processes (see the module docstring)."""
    import datetime

    import torch.distributed as dist

    from dispatchcore.executor import free_port

    port = free_port("127.0.0.1")
    store = dist.TCPStore("127.0.0.1", port, None, True, datetime.timedelta(seconds=120), wait_for_workers=False)
    joins = [src.floor_join(port), dst.floor_join(port)]
    for j in joins:
        j.get()

    def once() -> None:
        pending = [src.floor_send(), dst.floor_recv()]
        for p in pending:
            p.get()

    floor = timed(once, repeats)
    del store
    return floor


def measured(fn: Any, repeats: int, marks: list[Any]) -> tuple[float, list[int]]:
    """Median seconds of ``fn`` and each process's resident high-water mark over it, above the level before."""
    before = [m[0]() for m in marks]
    seconds = timed(fn, repeats)
    return seconds, [
        max(0, peak - base) for m, b in zip(marks, before, strict=True) for peak, base in zip(m[1](), b, strict=True)
    ]


def run(backend: str, spec: Spec, repeats: int, bucket_mib: int) -> list[list[object]]:
    """Rows for ``backend``: ours (copying in ``load_weights``), ours with lent parameters, against the floor."""
    nbytes = sum(s[1].itemsize * int(torch.Size(s[0]).numel()) for s in spec.values())
    launched = "TORCHELASTIC_RUN_ID" in os.environ
    placed: list[dict[str, Any]] = [{"ranks": [0, 1]}, {"ranks": [2, 3]}] if launched else [{}, {}]
    with (
        WorkerGroup(Trainer, 2, backend=backend, init_kwargs={"spec": spec}, **placed[0]) as src,
        WorkerGroup(Rollout, 2, backend=backend, init_kwargs={"spec": spec}, **placed[1]) as dst,
    ):
        if backend == "local":  # one process: its high-water mark covers all four ranks
            marks: list[Any] = [(lambda: [mem_mark()], lambda: [mem_peak()])]
        else:
            marks = [(wg.mem_mark, wg.mem_peak) for wg in (src, dst)]
        sync = WeightSync(src, dst, bucket_bytes=bucket_mib << 20)
        results = {}
        for lend in (False, True):
            dst.set_lend(lend)
            before = driver_traffic()
            ours, peaks = measured(lambda: sync(version=0), repeats, marks)
            results[lend] = (ours, peaks, (driver_traffic() - before).total, dst.checksum())
        if backend == "local":
            executor: Any = src.executor
            shards = [executor.rank_threads[r].host.worker.shards for r in range(2)]
            params = [dst.executor.rank_threads[r].host.worker.params for r in range(2)]
            floor = timed(lambda: local_floor(spec, shards, params), repeats)
        elif backend == "torchrun":
            floor = torchrun_floor(src, dst, repeats)
            backend = "torchrun, one launch" if launched else "torchrun, two worlds"
        else:
            floor = timed(lambda: dst.floor_get(*src.floor_put()), repeats)
    rows = []
    for lend, (ours, peaks, crossed, sums) in results.items():
        ratio = floor / ours
        rows.append([
            backend,
            f"{nbytes / 2**20:.0f} MiB / {len(spec)}",
            "lent params" if lend else "copy in load_weights",
            ours,
            nbytes / ours / 1e9,
            nbytes / floor / 1e9,
            f"{ratio:.2f} ({'met' if ratio >= 0.8 else 'not met'})",
            crossed,
            " / ".join(f"{p / 2**20:.0f}" for p in peaks),
            "ok" if sums[0] == sums[1] else "MISMATCH",
        ])  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--backends", default="local,ray")
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--bucket-mib", type=int, default=64)
    args = parser.parse_args()
    spec = weight_set(args.mib)
    repeats = 3 if args.quick else 7
    rows = []
    for backend in args.backends.split(","):
        if backend == "ray":
            import ray

            if not ray.is_initialized():
                ray.init(include_dashboard=False, log_to_driver=False)
        rows.extend(run(backend, spec, repeats, args.bucket_mib))
    header = [
        "backend",
        "weights",
        "destination",
        "ours s",
        "ours GB/s",
        "floor GB/s",
        "floor/ours",
        "driver bytes",
        "peak extra MiB per rank (trainer 0 / 1 / rollout 0 / 1)",
        "check",
    ]
    print_table(
        f"weight sync, trainer 2 ranks (dim-0 halves) -> rollout 2 ranks (whole), {args.bucket_mib} MiB buckets",
        header,
        rows,
    )


if __name__ == "__main__":
    main()
