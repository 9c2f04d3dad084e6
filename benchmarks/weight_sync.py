"""Weight sync (``WeightSync``) against the hand-written floor for the same bytes, in the same run.

Run ``python -m benchmarks.weight_sync [--quick] [--backends local,torchrun,ray]``.
Three weight sets of mixed sizes and dtypes (float32, bfloat16): 0.34 MB
(a tiny model: ~20 tensors), 49 MiB and 257 MiB; a trainer group of 2
ranks each holding half of every tensor (dim-0 shards) and a rollout group
of 2 ranks each wanting all of it.  Each backend is measured with the
rollout copying every tensor into its preallocated parameters in
``load_weights`` (as vLLM does) and with the rollout lending its parameters
(``weight_buffers``) so the weights land in place.  Floors, between the same
ranks:

* local: a plain copy of every shard into each rollout rank's parameters
  (two threads, one per rollout rank, as the ranks are threads);
* torchrun and ray: raw gloo point to point between the same four
  processes (a ``ProcessGroupGloo`` the benchmark builds on its own
  loopback store): each trainer rank sends every shard to both rollout
  ranks, which receive straight into their parameters (no copy at all).

Goals (issue 32): the 0.34 MB set within 2x of raw gloo's time (torchrun,
ray); 49 MiB and 257 MiB at >= 0.8x the floor's bandwidth.  ``--backends
torchrun`` self-starts two worlds (one per group); under ``torchrun
--standalone --nproc-per-node=4 -m benchmarks.weight_sync --backends
torchrun`` the groups share one launch (ranks 0-1 and 2-3).  Prints the
median seconds, GB/s (the weight set's bytes delivered to every rollout
rank per second), floor/ours with its goal, the report's rank phases
(``TransferReport.phases``: pack / move / apply, seconds summed over ranks)
and whether both rollout ranks hold the same weights.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import print_table  # noqa: E402
from dispatchcore import Dispatch, RowShard, WeightSync, Worker, WorkerGroup, register  # noqa: E402

Spec = dict[str, tuple[tuple[int, ...], torch.dtype]]

#: The sets: label -> bytes.
SETS = {"0.34 MB": 340_000, "49 MiB": 49 << 20, "257 MiB": 257 << 20}


def weight_set(nbytes: int) -> Spec:
    """About ``nbytes`` in tensors of three kinds: matrices, smaller matrices, odd-length vectors."""
    big = nbytes >= 4 << 20
    spec: Spec = {}
    used, i = 0, 0
    while used < nbytes:
        kind = i % 3
        if big:
            shape = [(1024 + 2 * (i % 7), 512), (257 + i % 13, 256), (4096 + i % 5,)][kind]
        else:
            shape = [(128 + i % 7, 64), (33 + i % 5, 64), (128 + i % 3,)][kind]
        dtype = torch.float32 if i % 2 else torch.bfloat16
        spec[f"layer.{i // 3}.p{kind}"] = (shape, dtype)
        used += dtype.itemsize * int(torch.Size(shape).numel())
        i += 1
    return spec


def half(n: int, rank: int) -> tuple[int, int]:
    mid = (n + 1) // 2
    return (0, mid) if rank == 0 else (mid, n)


def _join(worker: Any, port: int, rank: int) -> int:
    """The floor's own gloo group of the four ranks (trainers 0-1, rollouts 2-3), on the driver's store."""
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", port, None, False, datetime.timedelta(seconds=120), wait_for_workers=False)
    options = dist.ProcessGroupGloo._Options()  # type: ignore[attr-defined]
    options._timeout = datetime.timedelta(seconds=300)
    options._devices = [dist.ProcessGroupGloo.create_device(hostname="127.0.0.1")]
    worker.floor = dist.ProcessGroupGloo(dist.PrefixStore("floor/", store), rank, 4, options)
    return 0


class Trainer(Worker):
    @register(Dispatch.ONE_TO_ALL)
    def configure(self, spec: Spec) -> None:
        self.shards = {}
        for name, (shape, dtype) in spec.items():
            lo, hi = half(shape[0], self.rank)
            values = torch.full((hi - lo, *shape[1:]), float(self.rank + 1), dtype=dtype)
            self.shards[name] = RowShard(values, lo, shape)

    def weights(self) -> dict[str, RowShard]:
        return self.shards

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


class Rollout(Worker):
    @register(Dispatch.ONE_TO_ALL)
    def configure(self, spec: Spec, lend: bool = False) -> None:
        self.spec, self.lend = spec, lend
        self.params = {name: torch.zeros(shape, dtype=dtype) for name, (shape, dtype) in spec.items()}

    def load_weights(self, weights: list[tuple[str, torch.Tensor]]) -> None:
        for name, t in weights:
            self.params[name].copy_(t)

    def weight_buffers(self, shapes: dict[str, Any]) -> dict[str, torch.Tensor]:
        """With ``lend`` on, the parameters themselves: the weights land in place (no copy in ``load_weights``)."""
        return self.params if self.lend else {}

    @register(Dispatch.ONE_TO_ALL)
    def checksum(self) -> float:
        return float(sum(p.double().sum() for p in self.params.values()))

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


def local_floor(spec: Spec, shards: list[dict[str, RowShard]], params: list[dict[str, torch.Tensor]]) -> None:
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


def timed(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm-up: first touch of buffers, the bridges, imports
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def gloo_floor(src: Any, dst: Any) -> Callable[[], None]:
    """Join the floor's gloo group of the four processes; one raw move of the configured set."""
    import torch.distributed as dist

    from dispatchcore.executor import free_port

    port = free_port("127.0.0.1")
    store = dist.TCPStore("127.0.0.1", port, None, True, datetime.timedelta(seconds=120), wait_for_workers=False)
    for joined in [src.floor_join(port), dst.floor_join(port)]:
        joined.get()

    def once() -> None:
        for pending in [src.floor_send(), dst.floor_recv()]:
            pending.get()

    once.store = store  # type: ignore[attr-defined]  # the store lives as long as the floor
    return once


def goal(label: str, backend: str, ratio: float) -> str:
    if label == "0.34 MB":
        if backend == "local":
            return f"{ratio:.2f} (no goal)"
        return f"{ratio:.2f} ({'met' if ratio >= 0.5 else 'not met'}: within 2x)"
    return f"{ratio:.2f} ({'met' if ratio >= 0.8 else 'not met'}: >= 0.8)"


def run(backend: str, repeats: dict[str, int]) -> list[list[object]]:
    """Rows for ``backend``: every set, copying and lending, against the floor."""
    launched = "TORCHELASTIC_RUN_ID" in os.environ
    placed: list[dict[str, Any]] = [{"ranks": [0, 1]}, {"ranks": [2, 3]}] if launched else [{}, {}]
    rows = []
    with (
        WorkerGroup(Trainer, 2, backend=backend, **placed[0]) as src,
        WorkerGroup(Rollout, 2, backend=backend, **placed[1]) as dst,
    ):
        raw = None if backend == "local" else gloo_floor(src, dst)
        name = backend if backend != "torchrun" else "torchrun, one launch" if launched else "torchrun, two worlds"
        for label, nbytes in SETS.items():
            spec = weight_set(nbytes)
            size = sum(s[1].itemsize * int(torch.Size(s[0]).numel()) for s in spec.values())
            src.configure(spec)
            results = {}
            for lend in (False, True):
                dst.configure(spec, lend)
                sync = WeightSync(src, dst)
                reports = []
                ours = timed(lambda: reports.append(sync(version=0)), repeats[label])
                results[lend] = (ours, getattr(reports[-1], "phases", {}), dst.checksum())
            if raw is None:
                shards = [src.executor.rank_threads[r].host.worker.shards for r in range(2)]
                params = [dst.executor.rank_threads[r].host.worker.params for r in range(2)]
                floor = timed(lambda: local_floor(spec, shards, params), repeats[label])
            else:
                floor = timed(raw, repeats[label])
            for lend, (ours, phases, sums) in results.items():
                rows.append([
                    name, f"{label} / {len(spec)}", "lent" if lend else "copy",
                    ours * 1e3, floor * 1e3, size / ours / 1e9, size / floor / 1e9, goal(label, backend, floor / ours),
                    " / ".join(f"{phases.get(p, 0.0) * 1e3:.1f}" for p in ("pack", "move", "apply")) if phases else "-",
                    "ok" if sums[0] == sums[1] else "MISMATCH",
                ])  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--backends", default="local,torchrun,ray")
    args = parser.parse_args()
    repeats = {"0.34 MB": 10 if args.quick else 30, "49 MiB": 3 if args.quick else 7, "257 MiB": 3 if args.quick else 7}
    rows = []
    for backend in args.backends.split(","):
        if backend == "ray":
            import ray

            if not ray.is_initialized():
                ray.init(include_dashboard=False, log_to_driver=False)
        rows.extend(run(backend, repeats))
    header = [
        "backend", "set / tensors", "rollout", "ours ms", "floor ms", "ours GB/s", "floor GB/s",
        "floor/ours (goal)", "pack / move / apply ms", "check",
    ]  # fmt: skip
    print_table("weight sync, trainer 2 ranks (dim-0 halves) -> rollout 2 ranks (whole), 64 MiB buckets", header, rows)


if __name__ == "__main__":
    main()
