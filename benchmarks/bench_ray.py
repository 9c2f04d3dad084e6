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

When verl is importable (a separate venv; verl is not a dependency), the
same run also measures verl's ``RayWorkerGroup`` with an equivalent worker
(empty call, DP echo 8 KB / 1 MB / 64 MB) under its default serialization
(``torch.save`` of the batch) and its numpy one
(``VERL_DATAPROTO_SERIALIZATION_METHOD=numpy``, read by ``DataProto.__getstate__``
on the driver and on the workers, so it is set on both), and prints
dispatchcore / verl-best.
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


# -- the control lane against raw Ray and torchrun's lane ------------------------------------------------
LANE_VARIANTS = ("lane", "raw Ray", "torchrun lane")


def bench_lane(ray: Any, n: int, sizes: dict[str, int], repeats: dict[str, int]) -> list[dict[str, Any]]:
    """Empty call and DP echo per size, every variant in the same rounds (so noise hits them alike)."""
    raw = Raw(ray, n)
    groups = {
        "lane": WorkerGroup(BenchWorker, n, backend="ray"),
        "torchrun lane": WorkerGroup(BenchWorker, n, backend="torchrun"),
    }
    assert groups["lane"].executor._lane is not None, "the lane did not come up"  # noqa: SLF001 - a benchmark check
    rows = []
    try:
        cases: dict[str, dict[str, Callable[[], Any]]] = {
            "empty call": {**{k: g.noop for k, g in groups.items()}, "raw Ray": raw.empty}
        }
        for label, cols in sizes.items():
            x = torch.arange(ROWS * cols, dtype=torch.int64).reshape(ROWS, cols)
            data = DataProto.from_dict({"input_ids": x})
            assert torch.equal(groups["lane"].echo(data).batch["input_ids"], x)
            echo = {k: (lambda g=g, d=data: g.echo(d)) for k, g in groups.items()}
            cases[f"echo {label}"] = {**echo, "raw Ray": lambda x=x: raw.numpy_views(x, True)}
        for case, fns in cases.items():
            reps = repeats["empty"] if case == "empty call" else repeats.get(case[5:], 3)
            rows.append({"n": n, "case": case, **_rounds(fns, reps, big="64" in case or "256" in case)})
    finally:
        for group in groups.values():
            group.shutdown()
        raw.close()
    return rows


def _rounds(fns: dict[str, Callable[[], Any]], reps: int, big: bool) -> dict[str, float]:
    """Median ms of each function, measured in alternating rounds of ``reps`` calls."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    for fn in fns.values():
        fn()
    for _ in range(5 if not big else 2):
        for key, fn in fns.items():
            times[key].append(median_ms(fn, max(1, reps // 5) if not big else reps, 0, collect=big))
    return {key: statistics.median(v) for key, v in times.items()}


def lane_table(rows: list[dict[str, Any]]) -> str:
    """The lane's goals at N = 2 and 4, each marked met or not."""
    head = "| N | case | lane (ms) | raw Ray | torchrun lane | goal | met |"
    lines = [head, "|" + " --- |" * 7]
    for r in rows:
        goal, met = _lane_goal(r)
        cells = [f"{r[k]:.2f}" if k in r else "-" for k in LANE_VARIANTS]
        lines.append(
            f"| {r['n']} | {r['case']} | " + " | ".join(cells) + f" | {goal} | {'met' if met else 'NOT met'} |"
        )
    lines.append("")
    lines.append("Medians of alternating rounds in one run; raw Ray = numpy views per chunk with the copy on receipt.")
    return "\n".join(lines)


def _lane_goal(r: dict[str, Any]) -> tuple[str, bool]:
    lane = r["lane"]
    if r["case"] == "empty call":
        return "<= 0.3 ms and >= 3x faster than raw Ray", lane <= 0.3 and r["raw Ray"] / lane >= 3
    if r["case"] == "echo 8 KB":
        return "within 1.2x of torchrun's lane", lane <= 1.2 * r["torchrun lane"]
    return "no slower than raw Ray", lane <= r["raw Ray"]


# -- verl 0.9.1 in the same run (when importable) ----------------------------------------------
VERL_SIZES = ("8 KB", "1 MB", "64 MB")
VERL_NUMPY = "VERL_DATAPROTO_SERIALIZATION_METHOD"


def _verl_worker_cls() -> Any:
    from verl import DataProto as VerlDataProto
    from verl.single_controller.base import Worker as VerlWorker
    from verl.single_controller.base.decorator import Dispatch as VerlDispatch
    from verl.single_controller.base.decorator import register as verl_register

    class VerlBenchWorker(VerlWorker):
        """The same echo and empty call as ``BenchWorker``, written for verl."""

        @verl_register(dispatch_mode=VerlDispatch.ONE_TO_ALL)
        def noop(self) -> None:
            return None

        @verl_register(dispatch_mode=VerlDispatch.DP_COMPUTE_PROTO)
        def echo(self, data: VerlDataProto) -> VerlDataProto:
            return data

    return VerlBenchWorker


def bench_verl(ray: Any, n: int, repeats: dict[str, int]) -> list[dict[str, Any]]:
    """verl's ``RayWorkerGroup``, default serialization then numpy, one group at a time."""
    import os

    from verl import DataProto as VerlDataProto
    from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup

    worker = ray.remote(_verl_worker_cls())
    out: dict[str, dict[str, float]] = {}
    for serialization in ("default", "numpy"):
        env = {VERL_NUMPY: "numpy"} if serialization == "numpy" else {}
        saved = os.environ.pop(VERL_NUMPY, None)
        os.environ.update(env)  # the driver side pickles by it too
        pool = RayResourcePool([n], use_gpu=False, max_colocate_count=1)
        wg = RayWorkerGroup(pool, RayClassWithInitArgs(cls=worker), device_name="cpu", worker_env=env)
        try:
            times = {"empty call": median_ms(wg.noop, repeats["empty"], 5)}
            for label in VERL_SIZES:
                x = torch.arange(ROWS * SIZES[label], dtype=torch.int64).reshape(ROWS, SIZES[label])
                data = VerlDataProto.from_dict({"input_ids": x})
                assert torch.equal(wg.echo(data).batch["input_ids"], x)
                times[f"echo {label}"] = median_ms(lambda d=data: wg.echo(d), repeats[label], collect=label == "64 MB")
            out[serialization] = times
        finally:
            for actor in wg.workers:
                ray.kill(actor)
            for pg in pool.pgs or []:
                ray.util.remove_placement_group(pg)
            os.environ.pop(VERL_NUMPY, None)
            if saved is not None:
                os.environ[VERL_NUMPY] = saved
    return [
        {"n": n, "case": case, "verl default": out["default"][case], "verl numpy": out["numpy"][case]}
        for case in out["default"]
    ]


def verl_table(rows: list[dict[str, Any]], verl_rows: list[dict[str, Any]]) -> str:
    ours = {(r["n"], r["case"]): r for r in rows}
    lines = [
        "| N | case | dispatchcore isolated (ms) | isolate=False (ms) | best raw Ray (ms) | verl default (ms) "
        "| verl numpy (ms) | isolated / verl-best | best raw / verl-best |",
        "|" + " --- |" * 9,
    ]
    for v in verl_rows:
        r = ours.get((v["n"], v["case"]))
        if r is None:
            continue
        best = min(v["verl default"], v["verl numpy"])
        lines.append(
            f"| {v['n']} | {v['case']} | {r['iso']:.2f} | {r['shared']:.2f} | {r['raw']:.2f} | {v['verl default']:.2f} "
            f"| {v['verl numpy']:.2f} | {r['iso'] / best:.2f}x | {r['raw'] / best:.2f}x |"
        )
    lines.append("")
    lines.append(
        "Ratios below 0.5x are 2x faster than verl at its best. A row whose best raw Ray ratio is above 0.5x "
        "cannot get there while every byte passes through the driver (results kept on the ranks: data-plane issue)."
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats, under ~2 minutes")
    parser.add_argument("--ranks", type=int, nargs="*", default=[2, 4])
    parser.add_argument("--sizes", nargs="*", default=list(SIZES), choices=list(SIZES))
    parser.add_argument("--num-cpus", type=int, default=4)
    parser.add_argument("--lane-only", action="store_true", help="only the control lane's table")
    args = parser.parse_args(argv)
    import ray

    have_verl = importlib.util.find_spec("verl") is not None
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
    verl_rows: list[dict[str, Any]] = []
    lane_rows: list[dict[str, Any]] = []
    lane_sizes = {k: v for k, v in sizes.items() if k != "256 MB"}
    try:
        for n in args.ranks:
            lane_rows += bench_lane(ray, n, lane_sizes, repeats)
            if args.lane_only:
                continue
            rows += bench_n(ray, n, sizes, repeats)
            if have_verl:
                verl_rows += bench_verl(ray, n, repeats)
            print(f"N={n} done", file=sys.stderr, flush=True)
    finally:
        if started:
            ray.shutdown()
    print(lane_table(lane_rows))
    print()
    if args.lane_only:
        return 0
    print(table(rows))
    print()
    if have_verl:
        print(verl_table(rows, verl_rows))
    else:
        print("verl columns omitted: verl is not importable here (install verl 0.9.1 in a separate venv to see them)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
