"""Soak one backend: many mixed calls while the driver's and the ranks' resources are sampled.

    python scripts/soak.py --backend ray --calls 10000

A seeded mix of calls (every built-in collect path, batches from empty to
~1 MB, blocking and ``blocking=False`` with a few futures in flight and some
passed straight into the next call, worker methods that raise and calls the
driver refuses) runs against one group.  After a warm-up the driver's RSS
(``/proc/self/status`` VmRSS), its threads, open fds and child processes,
each rank's RSS (``/proc/<pid>/status`` of the pids a ONE_TO_ALL call
returns) and, on Ray, the object store's used bytes and the references the
driver holds are sampled; at the end, after the last futures resolve, they
must be back where the warm-up left them.  The script prints the figures
and exits 1 when a criterion fails: RSS growth of 5% or more, or any count
or store figure above its baseline.  With ``DISPATCHCORE_RELIABILITY_OUT``
set, the figures are also appended there as a row of RELIABILITY.md's
``soak/<backend>`` table.

``tests/faults/test_soak.py`` runs the same soak in a short form; it loads
this file as a module, so everything here works without the command line.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch

from dispatchcore import (
    BatchSizeError,
    DataProto,
    DataProtoFuture,
    Dispatch,
    Worker,
    WorkerError,
    WorkerGroup,
    register,
)

#: Float32 columns of this width: 512 bytes a row, so 2048 rows are 1 MiB.
WIDTH = 128
#: Row counts of a batch: mostly small, sometimes empty, now and then ~1 MiB.
SIZES = (0, 1, 2, 7, 8, 64, 256, 2048)
SIZE_WEIGHTS = (4, 6, 8, 6, 30, 30, 12, 4)
#: Most futures kept unresolved at once (resolved oldest first).
MAX_IN_FLIGHT = 4
#: Seconds between refreshes of Ray's store figure, with margin (the raylet reports about once a second).
STORE_REFRESH_S = 1.5
#: Set to a path, the full run appends its figures there as a row of RELIABILITY.md's soak table.
RELIABILITY_ENV = "DISPATCHCORE_RELIABILITY_OUT"
#: RSS criterion of the full run (percent growth after warm-up).
RSS_GROWTH_LIMIT_PCT = 5.0


class SoakWorker(Worker):
    """Every collect path, a raising method and the rank's own pid and RSS."""

    @register(Dispatch.DP_COMPUTE_PROTO)
    def echo(self, data: DataProto) -> DataProto:
        return data

    @register(Dispatch.DP_COMPUTE_PROTO, blocking=False)
    def echo_later(self, data: DataProto) -> DataProto:
        return data

    @register(Dispatch.DP_COMPUTE_PROTO)
    def scale(self, data: DataProto, factor: float) -> DataProto:
        out = DataProto.from_dict({"x": data.batch["x"] * factor}) if data.batch is not None else data
        return out

    @register(Dispatch.DP_COMPUTE_METRIC)
    def count(self, data: DataProto) -> int:
        return len(data)

    @register(Dispatch.ONE_TO_ALL)
    def noop(self) -> None:
        return None

    @register(Dispatch.ALL_TO_ALL)
    def same(self, value: Any) -> Any:
        return value

    @register(Dispatch.DP_COMPUTE)
    def pick(self, value: Any) -> Any:
        return value

    @register(Dispatch.RANK_ZERO)
    def first(self, value: Any) -> Any:
        return value

    @register(Dispatch.ONE_TO_ALL)
    def fail(self, message: str) -> None:
        raise ValueError(message)

    @register(Dispatch.ONE_TO_ALL, blocking=False)
    def fail_later(self, message: str) -> None:
        raise ValueError(message)

    @register(Dispatch.ONE_TO_ALL)
    def pid(self) -> int:
        return os.getpid()


# -- resource readings ------------------------------------------------------------------


def rss_kib(pid: int | str = "self") -> int:
    """Resident set size of a process in KiB (``VmRSS`` of ``/proc/<pid>/status``), 0 if gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _children() -> int:
    """Live child processes of this one (zombies excluded)."""
    me, count = str(os.getpid()), 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                rest = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if rest[1] == me and rest[0] != "Z":
            count += 1
    return count


def ray_store() -> tuple[int, int] | None:
    """(object store bytes used on the cluster, references the driver holds), or None without Ray.

    The store figure comes from the GCS's resource view (what ``ray status``
    shows; no dashboard needed), refreshed by the raylet about once a second.
    """
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return None
    from ray.autoscaler.v2.sdk import get_cluster_status

    worker = ray._private.worker.global_worker
    status = get_cluster_status(worker.gcs_client.address)
    used = sum(int(r.used) for r in status.cluster_resource_usage if r.resource_name == "object_store_memory")
    return used, len(worker.core_worker.get_all_reference_counts())


@dataclass
class Sample:
    """One reading of everything the soak watches."""

    call: int
    driver_rss_kib: int
    rank_rss_kib: list[int]
    #: OS threads of the driver (``/proc/self/task``: Python's and native ones, e.g. Ray's or gloo's).
    threads: int
    fds: int
    children: int
    store_bytes: int | None = None
    driver_refs: int | None = None

    @classmethod
    def take(cls, call: int, rank_pids: list[int], ray: bool = False) -> Sample:
        """Read everything now; ``ray`` adds the store figures (a Ray group's soak)."""
        store = ray_store() if ray else None
        return cls(
            call=call,
            driver_rss_kib=rss_kib(),
            rank_rss_kib=[rss_kib(p) for p in rank_pids],
            threads=len(os.listdir("/proc/self/task")),
            fds=len(os.listdir("/proc/self/fd")),
            children=_children(),
            store_bytes=None if store is None else store[0],
            driver_refs=None if store is None else store[1],
        )


def steady_sample(call: int, rank_pids: list[int], ray: bool, within: float = 10.0) -> Sample:
    """A sample once Ray's store view has caught up (two equal readings a refresh apart); others at once."""
    sample = Sample.take(call, rank_pids, ray)
    deadline = time.monotonic() + within
    while sample.store_bytes is not None and time.monotonic() < deadline:
        time.sleep(STORE_REFRESH_S)
        again = Sample.take(call, rank_pids, ray)
        if (again.store_bytes, again.driver_refs) == (sample.store_bytes, sample.driver_refs):
            return again
        sample = again
    return sample


# -- the call mix -----------------------------------------------------------------------


def _batch(rng: random.Random, world_size: int, padding: bool = False) -> DataProto:
    """A batch of a drawn size: any length with padding, else a multiple of ``world_size``."""
    rows = rng.choices(SIZES, SIZE_WEIGHTS)[0]
    rows = rows + rng.randint(0, 3) if padding else rows - rows % world_size
    data = DataProto.from_dict(
        {"x": torch.full((rows, WIDTH), float(rows), dtype=torch.float32)},
        non_tensors={"id": np.arange(rows, dtype=np.int64)},
        auto_padding=padding,
    )
    return data


class CallMix:
    """A seeded sequence of calls against one group; counts what each kind did."""

    def __init__(self, wg: WorkerGroup[SoakWorker], seed: int) -> None:
        self.wg = wg
        self.rng = random.Random(seed)
        self.in_flight: list[tuple[DataProtoFuture, int]] = []
        self.counts: dict[str, int] = {}
        n = wg.world_size
        self.kinds: list[tuple[str, int, Callable[[], None]]] = [
            ("echo", 30, self._echo),
            ("echo padded", 8, lambda: self._echo(padding=True)),
            ("scale", 6, self._scale),
            ("count", 8, self._count),
            ("noop", 10, lambda: self._expect(wg.noop(), [None] * n)),
            ("same", 5, self._same),
            ("pick", 5, lambda: self._expect(wg.pick(list(range(n))), list(range(n)))),
            ("first", 4, lambda: self._expect(wg.first("r0"), "r0")),
            ("later", 12, self._later),
            ("later forwarded", 4, self._forwarded),
            ("raises", 4, self._raises),
            ("raises later", 2, self._raises_later),
            ("refused", 2, self._refused),
        ]

    def step(self) -> None:
        kind = self.rng.choices(self.kinds, [w for _, w, _ in self.kinds])[0]
        kind[2]()
        self.counts[kind[0]] = self.counts.get(kind[0], 0) + 1

    def drain(self) -> None:
        """Resolve every future still in flight."""
        while self.in_flight:
            self._resolve_oldest()

    @staticmethod
    def _expect(got: Any, want: Any) -> None:
        if got != want:
            raise AssertionError(f"soak call returned {got!r}, expected {want!r}")

    @staticmethod
    def _check(out: DataProto, rows: int) -> None:
        if len(out) != rows:
            raise AssertionError(f"soak echo returned {len(out)} rows, sent {rows}")

    def _echo(self, padding: bool = False) -> None:
        data = _batch(self.rng, self.wg.world_size, padding)
        self._check(self.wg.echo(data), len(data))

    def _scale(self) -> None:
        data = _batch(self.rng, self.wg.world_size, padding=True)
        out = self.wg.scale(data, 2.0)
        self._check(out, len(data))

    def _count(self) -> None:
        data = _batch(self.rng, self.wg.world_size, padding=True)
        counts = self.wg.count(data)
        padded = len(data) + (-len(data)) % self.wg.world_size
        self._expect(sum(counts), padded)

    def _same(self) -> None:
        n = self.wg.world_size
        value = {"step": self.rng.randint(0, 9), "blob": bytes(self.rng.randint(0, 4096))}
        self._expect(self.wg.same(value), [value] * n)

    def _later(self) -> None:
        data = _batch(self.rng, self.wg.world_size, padding=True)
        self.in_flight.append((self.wg.echo_later(data), len(data)))
        if len(self.in_flight) > MAX_IN_FLIGHT:
            self._resolve_oldest()

    def _forwarded(self) -> None:
        """A future passed straight into the next call (rows moved rank to rank where the backend can)."""
        data = _batch(self.rng, self.wg.world_size, padding=True)
        future = self.wg.echo_later(data)
        self._check(self.wg.echo(future), len(data))

    def _resolve_oldest(self) -> None:
        future, rows = self.in_flight.pop(0)
        self._check(future.get(), rows)

    def _raises(self) -> None:
        try:
            self.wg.fail("planted")
        except WorkerError:
            return
        raise AssertionError("a raising worker method did not raise WorkerError")

    def _raises_later(self) -> None:
        future = self.wg.fail_later("planted later")
        try:
            future.get()
        except WorkerError:
            return
        raise AssertionError("a raising blocking=False method did not raise WorkerError at get()")

    def _refused(self) -> None:
        """A batch that does not split, without padding: the driver refuses it before sending."""
        n = self.wg.world_size
        if n == 1:
            return
        data = DataProto.from_dict({"x": torch.zeros(n + 1, WIDTH)})
        try:
            self.wg.echo(data)
        except BatchSizeError:
            return
        raise AssertionError("an indivisible batch without padding was not refused")


# -- the run ----------------------------------------------------------------------------


@dataclass
class SoakResult:
    """Figures of one soak; :meth:`failures` applies the criteria."""

    backend: str
    world_size: int
    calls: int
    warmup: int
    seconds: float
    counts: dict[str, int]
    samples: list[Sample] = field(default_factory=list)
    baseline: Sample | None = None
    final: Sample | None = None

    @staticmethod
    def _growth(before: list[int], after: list[int]) -> float:
        start, end = statistics.median(before), statistics.median(after)
        return 0.0 if start <= 0 else 100.0 * (end - start) / start

    def _ends(self, from_half: bool = False) -> tuple[list[Sample], list[Sample]]:
        """The first and last few samples after warm-up, or from halfway (medians smooth allocator noise)."""
        after = [s for s in self.samples if s.call >= self.warmup]
        if from_half:
            after = after[len(after) // 2 :]
        k = max(1, min(3, len(after) // 4))
        return after[:k], after[-k:]

    @property
    def driver_rss_growth_second_half_pct(self) -> float:
        """Growth over the second half only: a leak keeps growing there, a warm-up plateau does not."""
        head, tail = self._ends(from_half=True)
        return self._growth([s.driver_rss_kib for s in head], [s.driver_rss_kib for s in tail])

    @property
    def driver_rss_growth_pct(self) -> float:
        head, tail = self._ends()
        return self._growth([s.driver_rss_kib for s in head], [s.driver_rss_kib for s in tail])

    @property
    def rank_rss_growth_pct(self) -> list[float]:
        head, tail = self._ends()
        ranks = len(head[0].rank_rss_kib) if head else 0
        return [
            self._growth([s.rank_rss_kib[r] for s in head], [s.rank_rss_kib[r] for s in tail]) for r in range(ranks)
        ]

    def flat_counts(self) -> dict[str, tuple[Any, Any]]:
        """Figures that must not grow: name -> (baseline, final)."""
        assert self.baseline is not None and self.final is not None
        pairs = {
            "threads": (self.baseline.threads, self.final.threads),
            "fds": (self.baseline.fds, self.final.fds),
            "processes": (self.baseline.children, self.final.children),
        }
        if self.baseline.store_bytes is not None:
            pairs["ray object store bytes"] = (self.baseline.store_bytes, self.final.store_bytes)
            pairs["ray driver references"] = (self.baseline.driver_refs, self.final.driver_refs)
        return pairs

    def failures(self, *, check_rss: bool = True) -> list[str]:
        """Every criterion that failed, in words (empty when the soak passed)."""
        out = [f"{name} grew from {a} to {b}" for name, (a, b) in self.flat_counts().items() if (b or 0) > (a or 0)]
        if check_rss:
            growth = self.driver_rss_growth_pct
            if growth >= RSS_GROWTH_LIMIT_PCT:
                out.append(f"driver RSS grew {growth:.1f}% after warm-up (limit {RSS_GROWTH_LIMIT_PCT}%)")
            for rank, g in enumerate(self.rank_rss_growth_pct):
                if g >= RSS_GROWTH_LIMIT_PCT:
                    out.append(f"rank {rank} RSS grew {g:.1f}% after warm-up (limit {RSS_GROWTH_LIMIT_PCT}%)")
        return out

    def figures(self) -> dict[str, Any]:
        """One flat row of figures (for RELIABILITY.md and the script's output)."""
        assert self.baseline is not None and self.final is not None
        row: dict[str, Any] = {
            "calls": self.calls,
            "warm-up calls": self.warmup,
            "calls/s": round(self.calls / self.seconds, 1) if self.seconds else None,
            "driver RSS MiB (after warm-up -> end)": (
                f"{self.baseline.driver_rss_kib / 1024:.0f} -> {self.final.driver_rss_kib / 1024:.0f}"
            ),
            "driver RSS growth %": round(self.driver_rss_growth_pct, 2),
            "driver RSS growth % (2nd half)": round(self.driver_rss_growth_second_half_pct, 2),
            "rank RSS growth %": [round(g, 2) for g in self.rank_rss_growth_pct],
        }
        for name, (a, b) in self.flat_counts().items():
            row[name] = f"{a} -> {b}"
        return row


def settle(rank_pids: list[int], baseline: Sample, calls: int, ray: bool, within: float) -> Sample:
    """The final sample, re-taken until no count is above its baseline or ``within`` s pass.

    Reaped threads, closed connections and the store's view (refreshed about
    once a second) lag a moment behind the last call.
    """
    deadline = time.monotonic() + within
    while True:
        gc.collect()
        final = Sample.take(calls, rank_pids, ray)
        above = (
            final.threads > baseline.threads
            or final.fds > baseline.fds
            or final.children > baseline.children
            or (final.store_bytes or 0) > (baseline.store_bytes or 0)
            or (final.driver_refs or 0) > (baseline.driver_refs or 0)
        )
        if not above or time.monotonic() >= deadline:
            return final
        time.sleep(0.25)


def soak(
    wg: WorkerGroup[SoakWorker],
    calls: int,
    *,
    seed: int = 0,
    warmup: int | None = None,
    samples: int = 50,
    settle_within: float = 15.0,
    progress: Callable[[int, Sample], None] | None = None,
) -> SoakResult:
    """Run ``calls`` mixed calls on ``wg`` (a group of :class:`SoakWorker`) and sample as it goes."""
    warmup = max(20, calls // 5) if warmup is None else warmup
    rank_pids = [] if wg.backend == "local" else [int(p) for p in wg.pid()]
    on_ray = wg.backend == "ray"
    mix = CallMix(wg, seed)
    every = max(1, (calls - warmup) // max(1, samples))
    result = SoakResult(wg.backend, wg.world_size, calls, warmup, 0.0, mix.counts)
    started = time.monotonic()
    for i in range(calls):
        if i == warmup:
            mix.drain()
            gc.collect()
            result.baseline = steady_sample(i, rank_pids, on_ray)
            result.samples.append(result.baseline)
        elif i > warmup and (i - warmup) % every == 0:
            sample = Sample.take(i, rank_pids, on_ray)
            result.samples.append(sample)
            if progress is not None:
                progress(i, sample)
        mix.step()
    mix.drain()
    result.seconds = time.monotonic() - started
    if result.baseline is None:  # fewer calls than the warm-up
        result.baseline = steady_sample(calls, rank_pids, on_ray)
    del mix
    result.final = settle(rank_pids, result.baseline, calls, on_ray, settle_within)
    result.samples.append(result.final)
    if rank_pids and [int(p) for p in wg.pid()] != rank_pids:
        raise AssertionError("a rank's process changed during the soak")
    return result


def make_group(backend: str, world_size: int = 2, **options: Any) -> WorkerGroup[SoakWorker]:
    """The group a soak runs on (a call bound, so a hang is an error rather than a stuck run)."""
    return WorkerGroup(SoakWorker, world_size, backend=backend, call_timeout=120.0, **options)


def _register_by_value() -> None:
    """Loaded by path (the test), this module is not importable in the ranks: ship it by value."""
    if __name__ == "__main__":
        return  # cloudpickle ships __main__'s classes by value already
    try:
        import cloudpickle
    except ImportError:  # only the local backend then, which pickles nothing
        return
    cloudpickle.register_pickle_by_value(sys.modules[__name__])


_register_by_value()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", default="local", help="local | ray | torchrun | multiprocess | ...")
    parser.add_argument("--calls", type=int, default=10_000)
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--warmup", type=int, default=None, help="calls before the baseline (default: a fifth)")
    parser.add_argument("--samples", type=int, default=50, help="readings after warm-up")
    parser.add_argument("--json", metavar="PATH", help="also write the figures and samples here")
    parser.add_argument("--ray-address", default="local", help="Ray to connect to (default: start a private local one)")
    args = parser.parse_args(argv)

    if args.backend == "ray":
        import ray

        if not ray.is_initialized():
            local = args.ray_address == "local"
            extra = {"num_cpus": 4, "include_dashboard": False} if local else {}
            ray.init(address=args.ray_address, log_to_driver=False, **extra)
    wg = make_group(args.backend, args.world_size)
    try:

        def progress(i: int, s: Sample) -> None:
            ranks = ", ".join(f"{k / 1024:.0f}" for k in s.rank_rss_kib)
            store = "" if s.store_bytes is None else f" store {s.store_bytes / 2**20:.1f} MiB refs {s.driver_refs}"
            print(
                f"  call {i:>6}: driver RSS {s.driver_rss_kib / 1024:.1f} MiB, ranks [{ranks}] MiB, "
                f"threads {s.threads}, fds {s.fds}, processes {s.children}{store}",
                flush=True,
            )

        result = soak(wg, args.calls, seed=args.seed, warmup=args.warmup, samples=args.samples, progress=progress)
    finally:
        wg.shutdown()
    print(f"\nsoak {args.backend} x{args.world_size}: {args.calls} calls in {result.seconds:.1f} s")
    for name, value in result.figures().items():
        print(f"  {name}: {value}")
    print(f"  calls by kind: {dict(sorted(result.counts.items()))}")
    failed = result.failures()
    out = os.environ.get(RELIABILITY_ENV)
    if out:  # the same JSON lines as tests/faults' ``record`` fixture: a row of RELIABILITY.md
        row = {"form": f"full ({args.calls} calls)", **result.figures(), "criteria": "; ".join(failed) or "met"}
        with open(out, "a") as f:
            f.write(json.dumps({"table": f"soak/{args.backend}", **row}, default=str, sort_keys=True) + "\n")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"figures": result.figures(), "failures": failed, "samples": [asdict(s) for s in result.samples]},
                f,
                indent=1,
            )
    print("\nPASS" if not failed else "\nFAIL:\n  " + "\n  ".join(failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
