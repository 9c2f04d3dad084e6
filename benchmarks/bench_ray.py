"""dispatchcore's ray backend next to hand-written Ray doing the same work.

Run ``python benchmarks/bench_ray.py [--quick]``.  For N=2 and N=4 ranks:
an empty call, DP echo of int64 ``input_ids`` [1024, L] (8 KB .. 256 MB, plus
a variant with a numpy object column of strings) and a large-in/tiny-out
call.  Raw Ray variants, in the same run: ``torch.chunk`` (cloned) +
``.remote`` + ``ray.get`` + ``torch.cat``; numpy views per chunk; one
``ray.put`` of the whole array plus slice indices.  The isolated default is
compared with the best raw variant that makes the same copy on receipt;
``isolate=False`` with the best raw variant without it.  Medians of several
repeats, printed as a markdown table of milliseconds and ratios.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from dispatchcore import DataProto, Dispatch, Worker, WorkerGroup, register

ROWS = 1024
SIZES = {"8 KB": 1, "1 MB": 128, "64 MB": 8192, "256 MB": 32768}  # int64 columns per row


class BenchWorker(Worker):
    """What dispatchcore runs: echo, tiny output, nothing."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def noop(self) -> None:
        return None

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def echo(self, data: DataProto) -> DataProto:
        return data

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def count(self, data: DataProto) -> DataProto:
        ids = data.batch["input_ids"]
        return DataProto.from_dict({"count": torch.full((len(ids),), ids.shape[1], dtype=torch.int64)})


class RawWorker:
    """What hand-written Ray runs; ``copy`` makes the copy on receipt that isolation makes."""

    def noop(self) -> None:
        return None

    def echo(self, x: Any, copy: bool) -> Any:
        if copy:
            x = x.clone() if isinstance(x, torch.Tensor) else np.array(x, copy=True)
        return x

    def echo_pair(self, x: np.ndarray, words: np.ndarray, copy: bool) -> tuple[np.ndarray, np.ndarray]:
        return (np.array(x, copy=True), np.array(words, copy=True)) if copy else (x, words)

    def echo_slice(self, x: np.ndarray, lo: int, hi: int, copy: bool) -> np.ndarray:
        part = x[lo:hi]
        return np.array(part, copy=True) if copy else part

    def count(self, x: np.ndarray, copy: bool) -> np.ndarray:
        if copy:
            x = np.array(x, copy=True)
        return np.full((len(x),), x.shape[1], dtype=np.int64)


def median_ms(fn: Callable[[], Any], repeats: int, warmup: int = 1, collect: bool = False) -> float:
    """Median wall time of ``fn`` in ms; ``collect`` runs the GC between repeats (big payloads)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        if collect:
            gc.collect()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


class Raw:
    """Hand-written Ray on ``n`` plain actors."""

    def __init__(self, ray: Any, n: int) -> None:
        self.ray = ray
        self.n = n
        self.actors = [ray.remote(num_cpus=0)(RawWorker).remote() for _ in range(n)]
        ray.get([a.noop.remote() for a in self.actors])

    def empty(self) -> None:
        self.ray.get([a.noop.remote() for a in self.actors])

    def torch_chunks(self, x: torch.Tensor, copy: bool) -> torch.Tensor:
        parts = [c.clone() for c in torch.chunk(x, self.n)]  # a chunk view would ship the whole storage
        return torch.cat(self.ray.get([a.echo.remote(p, copy) for a, p in zip(self.actors, parts, strict=True)]))

    def numpy_views(self, x: torch.Tensor, copy: bool) -> torch.Tensor:
        parts = np.array_split(x.numpy(), self.n)
        out = self.ray.get([a.echo.remote(p, copy) for a, p in zip(self.actors, parts, strict=True)])
        return torch.from_numpy(np.concatenate(out))

    def put_slices(self, x: torch.Tensor, copy: bool) -> torch.Tensor:
        ref = self.ray.put(x.numpy())
        step = len(x) // self.n
        refs = [a.echo_slice.remote(ref, i * step, (i + 1) * step, copy) for i, a in enumerate(self.actors)]
        return torch.from_numpy(np.concatenate(self.ray.get(refs)))

    def with_words(self, x: torch.Tensor, words: np.ndarray, copy: bool) -> tuple[torch.Tensor, np.ndarray]:
        xs, ws = np.array_split(x.numpy(), self.n), np.array_split(words, self.n)
        out = self.ray.get([a.echo_pair.remote(p, w, copy) for a, p, w in zip(self.actors, xs, ws, strict=True)])
        return torch.from_numpy(np.concatenate([o[0] for o in out])), np.concatenate([o[1] for o in out])

    def count(self, x: torch.Tensor, copy: bool) -> torch.Tensor:
        parts = np.array_split(x.numpy(), self.n)
        out = self.ray.get([a.count.remote(p, copy) for a, p in zip(self.actors, parts, strict=True)])
        return torch.from_numpy(np.concatenate(out))

    def close(self) -> None:
        for a in self.actors:
            self.ray.kill(a)


RAW_ECHO = {"torch chunks": Raw.torch_chunks, "numpy views": Raw.numpy_views, "put+slices": Raw.put_slices}


def bench_n(ray: Any, n: int, sizes: dict[str, int], repeats: dict[str, int]) -> list[dict[str, Any]]:
    raw = Raw(ray, n)
    iso = WorkerGroup(BenchWorker, n, backend="ray")
    shared = WorkerGroup(BenchWorker, n, backend="ray", isolate=False)
    rows: list[dict[str, Any]] = []
    try:
        e = repeats["empty"]
        raw_empty = median_ms(raw.empty, e, 5)
        rows.append(
            {
                "n": n,
                "case": "empty call",
                "iso": median_ms(iso.noop, e, 5),
                "raw_copy": raw_empty,
                "shared": median_ms(shared.noop, e, 5),
                "raw": raw_empty,
                "variants": {},
            }
        )
        for label, cols in sizes.items():
            rows += bench_size(raw, iso, shared, n, label, cols, repeats.get(label, 3))
    finally:
        iso.shutdown()
        shared.shutdown()
        raw.close()
    return rows


def bench_size(
    raw: Raw, iso: WorkerGroup[Any], shared: WorkerGroup[Any], n: int, label: str, cols: int, reps: int
) -> list[dict[str, Any]]:
    """Echo (and, at some sizes, the string-column and tiny-output cases) of one payload size."""
    big = cols >= 8192
    x = torch.arange(ROWS * cols, dtype=torch.int64).reshape(ROWS, cols)
    data = DataProto.from_dict({"input_ids": x})
    assert torch.equal(iso.echo(data).batch["input_ids"], x)

    def ms(fn: Callable[[], Any]) -> float:
        return median_ms(fn, reps, collect=big)

    variants = {
        name: (ms(lambda fn=fn: fn(raw, x, True)), ms(lambda fn=fn: fn(raw, x, False))) for name, fn in RAW_ECHO.items()
    }
    rows = [_row(n, f"echo {label}", ms(lambda: iso.echo(data)), ms(lambda: shared.echo(data)), variants)]
    if label in ("1 MB", "64 MB"):
        words = np.array([f"token-{i}" for i in range(ROWS)], dtype=object)
        mixed = DataProto.from_dict({"input_ids": x}, {"words": words})
        variants = {
            "numpy views": (ms(lambda: raw.with_words(x, words, True)), ms(lambda: raw.with_words(x, words, False)))
        }
        rows.append(
            _row(n, f"echo {label} + str column", ms(lambda: iso.echo(mixed)), ms(lambda: shared.echo(mixed)), variants)
        )
    if label == "64 MB":
        variants = {"numpy views": (ms(lambda: raw.count(x, True)), ms(lambda: raw.count(x, False)))}
        rows.append(
            _row(n, f"large in/tiny out {label}", ms(lambda: iso.count(data)), ms(lambda: shared.count(data)), variants)
        )
    return rows


def _row(n: int, case: str, iso: float, shared: float, variants: dict[str, tuple[float, float]]) -> dict[str, Any]:
    return {
        "n": n,
        "case": case,
        "iso": iso,
        "shared": shared,
        "variants": variants,
        "raw_copy": min(v[0] for v in variants.values()),
        "raw": min(v[1] for v in variants.values()),
    }


def table(rows: list[dict[str, Any]]) -> str:
    head = (
        "| N | case | isolated (ms) | raw + copy (ms) | ratio | isolate=False (ms) | raw (ms) | ratio "
        "| raw torch chunks | raw numpy views | raw put+slices |"
    )
    lines = [head, "|" + " --- |" * 11]
    for r in rows:
        cells = []
        for name in RAW_ECHO:
            v = r["variants"].get(name)
            cells.append(f"{v[0]:.1f} / {v[1]:.1f}" if v else "-")
        lines.append(
            f"| {r['n']} | {r['case']} | {r['iso']:.2f} | {r['raw_copy']:.2f} | {r['iso'] / r['raw_copy']:.2f}x "
            f"| {r['shared']:.2f} | {r['raw']:.2f} | {r['shared'] / r['raw']:.2f}x | " + " | ".join(cells) + " |"
        )
    lines.append("")
    lines.append("raw variant cells: with copy / without copy (ms). Ratios: dispatchcore / best raw.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats, under ~2 minutes")
    parser.add_argument("--ranks", type=int, nargs="*", default=[2, 4])
    parser.add_argument("--sizes", nargs="*", default=list(SIZES), choices=list(SIZES))
    parser.add_argument("--num-cpus", type=int, default=4)
    args = parser.parse_args(argv)
    import ray

    if importlib.util.find_spec("verl") is not None:
        print("verl is importable, but its column is not implemented here; skipped")
    if __name__ != "__main__":  # imported by a CLI: ship the worker classes by value
        import cloudpickle
        from ray import cloudpickle as ray_cloudpickle

        for pickler in (cloudpickle, ray_cloudpickle):
            pickler.register_pickle_by_value(sys.modules[__name__])
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=args.num_cpus, include_dashboard=False, log_to_driver=False)
    repeats = (
        {"empty": 30, "8 KB": 10, "1 MB": 8, "64 MB": 3, "256 MB": 2}
        if args.quick
        else {"empty": 200, "8 KB": 50, "1 MB": 30, "64 MB": 7, "256 MB": 5}
    )
    sizes = {k: SIZES[k] for k in args.sizes}
    rows: list[dict[str, Any]] = []
    try:
        for n in args.ranks:
            rows += bench_n(ray, n, sizes, repeats)
            print(f"N={n} done", file=sys.stderr, flush=True)
    finally:
        if started:
            ray.shutdown()
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
