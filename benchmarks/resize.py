"""Growing a rollout group (``wg.grow``) against starting a fresh group of the new size, in the same run.

Run ``python -m benchmarks.resize [--quick] [--backends local,torchrun,torchrun-new,ray]``.
Per backend, a trainer of 1 rank offers a 49 MiB weight set
(``WEIGHTS``) and a rollout group of 2 ranks holds it; then:

* **grow 2 -> 4**: from ``grow(2, sync=...)`` until both new ranks have
  answered a call holding the trainer's current weights;
* **fresh x4** (the baseline): from ``WorkerGroup(Rollout, 4)`` until all
  four ranks answer holding the weights (start, setup, one ``WeightSync``);
* **shrink 4 -> 3**: ``shrink(1)`` (a middle rank: the ranks above move down);
* the driver's cost of one empty call (median, ms) at 2 ranks, after the grow
  (4 ranks), after the shrink (3) and on the fresh group of 4.

``torchrun`` grows onto spare processes (``spare_ranks=2``), started with the
group: their start-up is in the group's, not in the grow's; ``torchrun-new``
has no spares: the grow starts two processes and rebuilds the row transport
at the new size.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

import torch

from dispatchcore import Dispatch, WeightSync, Worker, WorkerGroup, register

from ._common import median_ms, print_table

#: Per row: its backend and the rollout group's options.
FORMS: dict[str, tuple[str, dict[str, Any]]] = {
    "local": ("local", {}),
    "torchrun": ("torchrun", {"spare_ranks": 2}),
    "torchrun-new": ("torchrun", {}),
    "ray": ("ray", {}),
}
#: ``name: (shape, dtype)``: 49 MiB in 12 tensors.
WEIGHTS = {f"layer.{i}.w": ((1024, 1024 + 64 * i), torch.float32) for i in range(12)}


class Trainer(Worker):
    def __init__(self) -> None:
        self.held = {name: torch.full(shape, 0.5, dtype=dtype) for name, (shape, dtype) in WEIGHTS.items()}

    def weights(self) -> dict[str, torch.Tensor]:
        return self.held


class Rollout(Worker):
    def __init__(self) -> None:
        self.held = {name: torch.empty(shape, dtype=dtype) for name, (shape, dtype) in WEIGHTS.items()}

    @register(Dispatch.ONE_TO_ALL, setup=True)
    def configure(self, temperature: float) -> None:
        self.temperature = temperature

    def weight_buffers(self, shapes: Any) -> dict[str, torch.Tensor]:
        return self.held

    def load_weights(self, weights: Any) -> None:
        """The weights landed in ``held`` (lent by ``weight_buffers``)."""

    @register(Dispatch.ONE_TO_ALL)
    def checksum(self) -> float:
        return float(sum(t.sum() for t in self.held.values()))

    @register(Dispatch.ONE_TO_ALL)
    def noop(self) -> None:
        return None


def _expected() -> float:
    return float(sum(torch.full(shape, 0.5, dtype=dtype).sum() for shape, dtype in WEIGHTS.values()))


def _check(values: list[float]) -> None:
    want = _expected()
    if any(v != want for v in values):
        raise AssertionError(f"a rank does not hold the trainer's weights: {values} != {want}")


def measure(form: str, repeats: int) -> dict[str, float]:
    backend, options = FORMS[form]
    out: dict[str, float] = {}
    with WorkerGroup(Trainer, 1, backend=backend) as trainer, WorkerGroup(Rollout, 2, backend=backend, **options) as wg:
        wg.configure(0.7)
        sync = WeightSync(trainer, wg)
        sync(0)
        out["call x2"] = median_ms(wg.noop, repeats)
        start = time.perf_counter()
        wg.grow(2, sync=sync, version=0)
        _check(wg.ranks([2, 3]).checksum())
        out["grow"] = time.perf_counter() - start
        out["call x4"] = median_ms(wg.noop, repeats)
        _check(wg.checksum())
        start = time.perf_counter()
        wg.shrink(1)
        out["shrink"] = time.perf_counter() - start
        out["call x3"] = median_ms(wg.noop, repeats)
        start = time.perf_counter()
        with WorkerGroup(Rollout, 4, backend=backend) as fresh:
            fresh.configure(0.7)
            WeightSync(trainer, fresh)(0)
            _check(fresh.checksum())
            out["fresh"] = time.perf_counter() - start
            out["call fresh x4"] = median_ms(fresh.noop, repeats)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--backends", default=",".join(FORMS))
    args = parser.parse_args()
    repeats = 20 if args.quick else 100
    rows = []
    for backend in args.backends.split(","):
        if backend == "ray":
            import ray

            ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
            WorkerGroup(Rollout, 1, backend="ray").shutdown()  # Ray's worker pool warm, as a running job's is
        m = measure(backend, repeats)
        rows.append(
            [
                backend,
                m["grow"],
                m["fresh"],
                m["fresh"] / m["grow"],
                m["shrink"],
                m["call x2"],
                m["call x4"],
                m["call x3"],
                m["call fresh x4"],
            ]
        )
        print(f"{backend}: done", file=sys.stderr, flush=True)
    print_table(
        f"grow 2 -> 4 vs a fresh group of 4 ({os.cpu_count()} CPUs; seconds, and ms per empty call)",
        [
            "backend",
            "grow 2->4 (s)",
            "fresh x4 (s)",
            "fresh/grow",
            "shrink 4->3 (s)",
            "call x2 (ms)",
            "call x4 after grow (ms)",
            "call x3 after shrink (ms)",
            "call fresh x4 (ms)",
        ],
        rows,
    )


if __name__ == "__main__":
    main()
