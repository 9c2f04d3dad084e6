"""Weight sync (``WeightSync``) against the hand-written floor for the same bytes, in the same run.

Run ``python -m benchmarks.weight_sync [--quick] [--backends local,torchrun,ray] [--rounds 5]``.
Three weight sets of mixed sizes and dtypes (float32, bfloat16): 0.34 MB
(a tiny model: ~20 tensors), 49 MiB and 257 MiB (``--quick``: the first
two); a trainer group of 2 ranks each holding half of every tensor (dim-0
shards) and a rollout group of 2 ranks each wanting all of it.  Rollouts:
"copy" copies every tensor into its preallocated parameters in
``load_weights`` (as vLLM does), "lent" lends its parameters
(``weight_buffers``) so the weights land in place; each also with
``verify=True``.  Floors (issue 43), between the same ranks:

* the raw move, the floor of a lent row: local, a plain copy of every shard
  into each rollout rank's parameters (one thread per rollout rank, as the
  ranks are threads); torchrun and ray, raw gloo point to point between the
  same four processes (a ``ProcessGroupGloo`` the benchmark builds on its
  own loopback store), received straight into the parameters;
* the raw move plus one copy of the set on each rollout rank (the rollout's
  own copy in ``load_weights``), the floor of a copy row.

Every case of a set runs once per round, the rounds alternating the order
(``--rounds``, default 5); each figure is the median over rounds (a 0.34 MB
case: the median of 10 transfers per round), each ratio the median of the
rounds' own ratios.  Goals (issue 43): >= 0.8 of the floor at 49 MiB and
up, >= 0.5 at 0.34 MB, ``verify=True`` within 1.5x of the same rollout
unverified.  Prints GB/s (the weight set's bytes delivered to every
rollout rank per second), the report's rank phases (pack / move / apply /
digest, seconds summed over ranks; ``digest`` is verify's checksumming
on the destinations) and the driver's verify step, and whether both
rollout ranks hold the same weights.
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
    def configure(self, spec: Spec) -> None:
        self.spec = spec
        self.params = {name: torch.zeros(shape, dtype=dtype) for name, (shape, dtype) in spec.items()}
        self.scratch = {name: torch.zeros(shape, dtype=dtype) for name, (shape, dtype) in spec.items()}

    def load_weights(self, weights: list[tuple[str, torch.Tensor]]) -> None:
        for name, t in weights:
            self.params[name].copy_(t)

    def weight_buffers(self, shapes: dict[str, Any]) -> dict[str, torch.Tensor]:
        """The parameters themselves: the weights land in place (no copy in ``load_weights``)."""
        return self.params

    def weights(self) -> dict[str, torch.Tensor]:
        """What ``verify`` reads back."""
        return self.params

    @register(Dispatch.ONE_TO_ALL)
    def checksum(self) -> float:
        return float(sum(p.double().sum() for p in self.params.values()))

    @register(Dispatch.ONE_TO_ALL)
    def floor_copy(self) -> int:
        """The copy a copying rollout's ``load_weights`` makes: the whole set once, on this rank."""
        for name, p in self.params.items():
            self.scratch[name].copy_(p)
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
    """The median seconds of ``repeats`` runs of ``fn``."""
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


#: The cases of a set: (rollout, verify); "lent" and "copy" also name the floors.
CASES = [("copy", False), ("lent", False), ("copy", True), ("lent", True)]
PHASES = ("pack", "move", "apply", "digest")


def goal(label: str, ratio: float) -> str:
    want = 0.5 if label == "0.34 MB" else 0.8
    return f"{ratio:.2f} ({'met' if ratio >= want else 'not met'}: >= {want})"


def run(backend: str, sets: dict[str, int], rounds: int) -> list[list[object]]:
    """Rows for ``backend``: every set and case against its floor, rounds alternating."""
    launched = "TORCHELASTIC_RUN_ID" in os.environ
    placed: list[dict[str, Any]] = [{"ranks": [0, 1]}, {"ranks": [2, 3]}] if launched else [{}, {}]
    rows = []
    with (
        WorkerGroup(Trainer, 2, backend=backend, **placed[0]) as src,
        WorkerGroup(Rollout, 2, backend=backend, **placed[1]) as dst,
    ):
        raw = None if backend == "local" else gloo_floor(src, dst)
        name = backend if backend != "torchrun" else "torchrun, one launch" if launched else "torchrun, two worlds"
        for label, nbytes in sets.items():
            spec = weight_set(nbytes)
            size = sum(s[1].itemsize * int(torch.Size(s[0]).numel()) for s in spec.values())
            src.configure(spec)
            dst.configure(spec)
            if raw is None:
                shards = [src.executor.rank_threads[r].host.worker.shards for r in range(2)]
                params = [dst.executor.rank_threads[r].host.worker.params for r in range(2)]
                move: Callable[[], object] = lambda: local_floor(spec, shards, params)  # noqa: E731
            else:
                move = raw
            work = _work(src, dst, move)
            times, reports, sums = _rounds(work, 10 if label == "0.34 MB" else 1, rounds, dst.checksum)
            for rollout, verify in CASES:
                key = (rollout, verify)
                ours = statistics.median(times[key])
                floor = statistics.median(times[rollout])
                ratio = statistics.median(f / o for f, o in zip(times[rollout], times[key], strict=True))
                versus = "-"
                if verify:
                    plain = times[(rollout, False)]
                    versus = f"{statistics.median(o / p for o, p in zip(times[key], plain, strict=True)):.2f}"
                phases = reports[key]
                rows.append([
                    name, f"{label} / {len(spec)}", rollout + (" verify" if verify else ""),
                    ours * 1e3, floor * 1e3, size / ours / 1e9, size / floor / 1e9, goal(label, ratio), versus,
                    " / ".join(f"{phases.get(p, 0.0) * 1e3:.1f}" for p in PHASES),
                    f"{phases.get('verify', 0.0) * 1e3:.1f}", "ok" if sums[key][0] == sums[key][1] else "MISMATCH",
                ])  # fmt: skip
    return rows


def _work(src: Any, dst: Any, move: Callable[[], object]) -> dict[Any, Callable[[], Any]]:
    """What each case runs once: a transfer (its report), or a floor."""
    work: dict[Any, Callable[[], Any]] = {}
    for rollout, verify in CASES:
        sync = WeightSync(src, dst, lend=None if rollout == "copy" else "weight_buffers", verify=verify)
        work[(rollout, verify)] = lambda sync=sync: sync(version=0)
    work["lent"] = move
    work["copy"] = lambda: (move(), dst.floor_copy())
    return work


def _rounds(
    work: dict[Any, Callable[[], Any]], repeats: int, rounds: int, check: Callable[[], Any]
) -> tuple[Any, Any, Any]:
    """Every case once per round (a warm-up round first), the order reversed every other round."""
    times: dict[Any, list[float]] = {key: [] for key in work}
    reports: dict[Any, dict[str, float]] = {}
    sums: dict[Any, Any] = {}
    for fn in work.values():
        fn()  # warm-up: first touch of buffers, the bridges, imports
    order = list(work)
    for r in range(rounds):
        for key in order if r % 2 == 0 else order[::-1]:
            got: list[Any] = []
            times[key].append(timed(lambda key=key: got.append(work[key]()), repeats))
            if isinstance(key, tuple):
                reports.setdefault(key, {})
                if r == rounds // 2:  # the middle round's phases, per transfer
                    reports[key] = {p: v / repeats for p, v in _summed(got).items()}
    for key in work:
        if isinstance(key, tuple):
            work[key]()
            sums[key] = check()
    return times, reports, sums


def _summed(reports: list[Any]) -> dict[str, float]:
    out: dict[str, float] = {}
    for report in reports:
        for phase, seconds in getattr(report, "phases", {}).items():
            out[phase] = out.get(phase, 0.0) + seconds
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="the 0.34 MB and 49 MiB sets only")
    parser.add_argument("--backends", default="local,torchrun,ray")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sets", default="", help="comma-separated set labels (default: all, or --quick's)")
    args = parser.parse_args()
    wanted = args.sets.split(",") if args.sets else ["0.34 MB", "49 MiB"] if args.quick else list(SETS)
    sets = {label: SETS[label] for label in wanted}
    rows = []
    for backend in args.backends.split(","):
        if backend == "ray":
            import ray

            if not ray.is_initialized():
                ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        rows.extend(run(backend, sets, args.rounds))
    header = [
        "backend", "set / tensors", "rollout", "ours ms", "floor ms", "ours GB/s", "floor GB/s",
        "floor/ours (goal)", "verify / plain (goal <= 1.5)", "pack / move / apply / digest ms", "verify ms", "check",
    ]  # fmt: skip
    title = "weight sync, trainer 2 ranks (dim-0 halves) -> rollout 2 ranks (whole), 64 MiB buckets"
    print_table(f"{title}, medians of {args.rounds} alternating rounds", header, rows)


if __name__ == "__main__":
    main()
