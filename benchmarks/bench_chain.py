"""A verl-shaped three-stage chain, eager against lazy results, with the bytes that crossed the driver.

    python benchmarks/bench_chain.py --quick
    python benchmarks/bench_chain.py --backends ray torchrun --ranks 4 --sizes 64MB --steps 7

Every step, on two worker groups of N ranks each (torchrun: self-started ranks).
``--layout colocated`` (the default, as verl places actor and reference)
makes them two roles of one colocated class, sharing each rank's process;
``--layout separate`` makes them two groups (two worlds under self-started
torchrun, so there the lazy rows go through the driver):

1. ``generate`` (group "actor", ``DP_COMPUTE_PROTO``) turns a small prompt
   batch of 1024 rows into ``responses`` int64 [1024, L] and
   ``old_log_probs`` float32 [1024, L] (together the step's payload P: 64 MB
   or 256 MB) plus a small ``rewards`` column;
2. ``compute_ref`` (group "ref") reads both large columns and returns
   ``ref_log_prob`` float32 [1024, L];
3. the driver reads ``batch.batch["rewards"]`` only, computes a normalized
   advantage from it and writes it as a new column, as verl's trainer does;
4. ``update`` (group "actor") consumes the union of all of it and returns one
   loss and one KL number per row (the step's metrics).

Between stages the driver does ``batch = batch.union(out)``.  An eager step
pulls every result to the driver and pushes it out again (about 3.7 P each
way in all); a lazy step (``.options(lazy=True)`` on ``generate`` and
``compute_ref``) leaves the rows on the ranks and moves only references and
the small columns.  Eager and lazy steps alternate on the same groups, the
table shows medians, and the lazy metrics are checked to be exactly the eager
ones step by step.  Bytes through the driver are ``dispatchcore.driver_traffic()``
deltas over a step (sent + received).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import print_table  # noqa: E402
from dispatchcore import (  # noqa: E402
    DataProto,
    Dispatch,
    Worker,
    WorkerGroup,
    create_colocated_worker_cls,
    driver_traffic,
    register,
)

ROWS = 1024
MB = 1 << 20
#: Payload P per step: what ``generate`` returns (int64 + float32 per cell of [ROWS, L]).
SIZES = {"64MB": 64 * MB, "256MB": 256 * MB}
BACKENDS = ("local", "ray", "torchrun")
VOCAB = 50_000


def width_for(payload: int) -> int:
    """L such that ``responses`` + ``old_log_probs`` of [ROWS, L] take ``payload`` bytes."""
    return payload // (ROWS * (8 + 4))


class ChainWorker(Worker):
    """Both roles of the chain; each group uses the methods of its own role."""

    # The compute is one pass over each large column (the benchmark is about moving rows, on 2 cores),
    # but every value depends on its row and position, so misplaced rows or columns change the metrics.
    @register(Dispatch.DP_COMPUTE_PROTO)
    def generate(self, prompts: DataProto) -> DataProto:
        ids = prompts.batch["prompt_ids"]
        positions = torch.arange(int(prompts.meta_info["width"]))
        responses = torch.add(ids[:, None], positions[None, :])
        old_log_probs = torch.add(
            (ids % 1000).to(torch.float32)[:, None], positions.to(torch.float32)[None, :], alpha=1e-3
        )
        rewards = (ids % 10).to(torch.float32) / 10
        return DataProto.from_dict(
            {"responses": responses, "old_log_probs": old_log_probs.mul_(-1e-3), "rewards": rewards}
        )

    @register(Dispatch.DP_COMPUTE_PROTO)
    def compute_ref(self, data: DataProto) -> DataProto:
        ref = torch.mul(data.batch["old_log_probs"], 0.5).sub_(data.batch["responses"], alpha=1e-7)
        return DataProto.from_dict({"ref_log_prob": ref})

    @register(Dispatch.DP_COMPUTE_PROTO)
    def update(self, data: DataProto) -> DataProto:
        kl = torch.sub(data.batch["old_log_probs"], data.batch["ref_log_prob"]).mean(dim=1)
        tokens = data.batch["responses"].sum(dim=1).to(torch.float32)
        loss = -data.batch["advantages"] * kl + 1e-9 * tokens
        return DataProto.from_dict({"loss": loss, "kl": kl})


@dataclass
class Measured:
    """Per-step figures of one (backend, N, size) in one mode."""

    ms: list[float] = field(default_factory=list)
    driver_bytes: list[int] = field(default_factory=list)
    metrics: list[dict[str, torch.Tensor]] = field(default_factory=list)


def run_step(actor: Any, ref: Any, step: int, width: int, lazy: bool) -> tuple[float, int, dict[str, torch.Tensor]]:
    """One generate -> ref -> advantage -> update step; (ms, bytes through the driver, metrics)."""
    generator = torch.Generator().manual_seed(step)
    prompt_ids = torch.randint(0, VOCAB, (ROWS,), generator=generator)
    before = driver_traffic()
    started = time.perf_counter()
    batch = DataProto.from_dict({"prompt_ids": prompt_ids}, meta_info={"width": width})
    batch = batch.union(actor.generate.options(lazy=lazy)(batch))
    batch = batch.union(ref.compute_ref.options(lazy=lazy)(batch))
    rewards = batch.batch["rewards"]
    batch.batch["advantages"] = (rewards - rewards.mean()) / (rewards.std() + 1e-6)
    out = actor.update(batch)
    metrics = {"loss": out.batch["loss"].clone(), "kl": out.batch["kl"].clone()}
    del batch, out, rewards  # the step's rows (and, lazily, their references) end here
    elapsed = (time.perf_counter() - started) * 1e3
    moved = driver_traffic() - before
    return elapsed, moved.total, metrics


def measure(actor: Any, ref: Any, payload: int, steps: int) -> dict[bool, Measured]:
    """``steps`` eager and ``steps`` lazy steps, alternating, after one warm-up step of each."""
    width = width_for(payload)
    results = {False: Measured(), True: Measured()}
    for lazy in (False, True):
        run_step(actor, ref, 10_000, width, lazy)
    gc.collect()
    for step in range(steps):
        # Alternate which mode goes first, so neither always runs right after the other's frees.
        for lazy in (False, True) if step % 2 == 0 else (True, False):
            ms, moved, metrics = run_step(actor, ref, step, width, lazy)
            got = results[lazy]
            got.ms.append(ms)
            got.driver_bytes.append(moved)
            got.metrics.append(metrics)
            gc.collect()
    return results


def same_metrics(a: list[dict[str, torch.Tensor]], b: list[dict[str, torch.Tensor]]) -> bool:
    """Bit-for-bit the same numbers, step by step."""
    return len(a) == len(b) and all(
        x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x) for x, y in zip(a, b, strict=True)
    )


def ray_session(backend: str) -> tuple[Any, bool]:
    """Start a local Ray for the ray rows (if none is running); returns (ray module or None, started)."""
    if backend != "ray":
        return None, False
    import ray

    if __name__ != "__main__":  # imported (by `dispatchcore bench`): ship this module's classes by value
        import cloudpickle
        from ray import cloudpickle as ray_cloudpickle

        for pickler in (cloudpickle, ray_cloudpickle):
            pickler.register_pickle_by_value(sys.modules[__name__])
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    return ray, started


Row = tuple[Any, ...]


def run_backend(
    backend: str,
    ranks: Sequence[int],
    sizes: Sequence[str],
    steps: int,
    layout: str = "colocated",
    isolate: bool = True,
) -> tuple[list[Row], bool]:
    """Table rows for one backend; also whether every lazy step matched its eager twin."""
    rows: list[Row] = []
    all_equal = True
    ray, started = ray_session(backend)
    try:
        for n in ranks:
            with contextlib.ExitStack() as stack:
                if layout == "colocated":  # verl's layout: actor and reference roles share each rank
                    roles = create_colocated_worker_cls({"actor": ChainWorker, "ref": ChainWorker})
                    group = stack.enter_context(WorkerGroup(roles, n, backend=backend, isolate=isolate))
                    views = group.spawn({"actor", "ref"})
                    actor, ref = views["actor"], views["ref"]
                else:  # two groups: under self-started torchrun, two worlds (rows go through the driver)
                    actor = stack.enter_context(WorkerGroup(ChainWorker, n, backend=backend, isolate=isolate))
                    ref = stack.enter_context(WorkerGroup(ChainWorker, n, backend=backend, isolate=isolate))
                for label in sizes:
                    payload = SIZES[label]
                    got = measure(actor, ref, payload, steps)
                    eager, lazy = got[False], got[True]
                    equal = same_metrics(eager.metrics, lazy.metrics)
                    all_equal = all_equal and equal
                    eager_ms, lazy_ms = statistics.median(eager.ms), statistics.median(lazy.ms)
                    eager_mb = statistics.median(eager.driver_bytes) / MB
                    lazy_bytes = statistics.median(lazy.driver_bytes)
                    rows.append(
                        (
                            backend,
                            n,
                            label,
                            eager_ms,
                            lazy_ms,
                            f"{eager_ms / lazy_ms:.2f}x",
                            eager_mb,
                            lazy_bytes / MB,
                            f"{100 * lazy_bytes / payload:.3f}%",
                            "yes" if equal else "NO",
                        )
                    )
                    del got, eager, lazy
                    gc.collect()
                    print(f"{backend} N={n} {label} done", file=sys.stderr, flush=True)
    finally:
        if started:
            ray.shutdown()
    return rows, all_equal


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="64MB only, 3 steps of each mode")
    parser.add_argument("--backends", nargs="+", choices=BACKENDS, default=list(BACKENDS))
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4], help="ranks per group")
    parser.add_argument("--sizes", nargs="+", choices=list(SIZES), help="payload per step (default: both)")
    parser.add_argument("--steps", type=int, help="timed steps of each mode (default 5; --quick 3)")
    parser.add_argument("--layout", choices=["colocated", "separate"], default="colocated", help="see above")
    parser.add_argument(
        "--no-isolate", action="store_true", help="WorkerGroup(isolate=False): workers promise not to write inputs"
    )
    args = parser.parse_args(argv)
    if os.environ.get("TORCHELASTIC_RUN_ID"):
        raise SystemExit("bench_chain starts its own ranks: run it with python, not under torchrun")
    sizes = args.sizes or (["64MB"] if args.quick else list(SIZES))
    steps = args.steps or (3 if args.quick else 5)
    if steps < 1:
        raise SystemExit(f"--steps must be at least 1, got {steps}")
    from dispatchcore import available_backends

    rows: list[Row] = []
    all_equal = True
    skipped = []
    for backend in args.backends:
        if backend not in available_backends():
            skipped.append(backend)
            continue
        got, equal = run_backend(backend, args.ranks, sizes, steps, args.layout, not args.no_isolate)
        rows += got
        all_equal = all_equal and equal
    print_table(
        f"chain generate -> ref -> update ({args.layout} roles, isolate={not args.no_isolate}), eager vs lazy "
        f"(medians of {steps} alternating steps each)",
        [
            "backend",
            "N",
            "size",
            "eager ms",
            "lazy ms",
            "speed-up",
            "eager MB via driver",
            "lazy MB via driver",
            "lazy % of payload via driver",
            "lazy = eager",
        ],
        rows,
    )
    if skipped:
        print(f"\nskipped (backend not available here): {', '.join(skipped)}")
    print(
        "\nlazy metrics "
        + (
            "equal the eager ones exactly (every step, every backend)"
            if all_equal
            else "DIFFER from the eager ones (see rows marked NO)"
        )
    )
    return 0 if all_equal else 1


if __name__ == "__main__":
    sys.exit(main())
