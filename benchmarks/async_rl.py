"""A GRPO-shaped loop synchronously and through a ``RolloutStream`` with k = 0, 1, 2, in one run.

Run ``python -m benchmarks.async_rl [--quick] [--backend torchrun]``.
Generation and training are sleeps: each prompt batch's generation time is
drawn once (seeded) from a lognormal with a long tail (``--sigma``, mean
``--gen-ms``), so every mode sees the same batches; a training step sleeps
about the mean generation (``--train-ms``).  Per step the trainer takes one
batch per rollout rank.

* **sync**: ``rollout.generate(all batches of the step)`` (the step waits for
  its slowest rank), ``trainer.train``, ``WeightSync(trainer, rollout)``;
* **async k**: ``RolloutStream(..., policy=MaxStaleness(k))`` with the
  trainer's weights snapshot into a one-rank stage group at each step
  boundary (``snapshot=``) and each rollout rank updated from the stage at
  its next call boundary (``weights_from=``), while the trainer trains;
* **k=1 no stage**: the same with ``weights_from=trainer`` (each rank's sync
  waits for the trainer's running step).

Modes alternate within each round; the table gives the median samples per
second over rounds, the ratio to sync, and the staleness histogram of every
consumed batch.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import statistics
import time

import torch

from dispatchcore import (
    DataProto,
    Dispatch,
    MaxStaleness,
    RolloutStream,
    WeightSync,
    Worker,
    WorkerGroup,
    register,
    versioned,
    weights_version_of,
)

from ._common import print_table

ROWS = 8  # prompts per batch
TOKENS = 256  # response length: rows of int64 tokens
WEIGHTS = 1 << 18  # float32 elements (1 MiB)


class Trainer(Worker):
    def __init__(self, train_s: float) -> None:
        self.train_s = train_s
        self.w = torch.zeros(WEIGHTS)

    def weights(self) -> dict[str, torch.Tensor]:
        return {"w": self.w}

    @register(Dispatch.ONE_TO_ALL)
    def reset(self) -> None:
        self.w.zero_()

    @register(Dispatch.DP_COMPUTE_PROTO)
    def train(self, data: DataProto) -> DataProto:
        time.sleep(self.train_s)
        self.w += 1.0
        return DataProto.from_dict({"tokens": data.batch["tokens"].sum(dim=1, keepdim=True)})


class Stage(Worker):
    """Holds the last snapshot of the trainer's weights (one extra copy) and serves it to rollout ranks."""

    def __init__(self) -> None:
        self.held: dict[str, torch.Tensor] = {}

    def load_weights(self, weights: list[tuple[str, torch.Tensor]]) -> None:
        for name, t in weights:
            self.held[name] = t.clone()

    def weights(self) -> dict[str, torch.Tensor]:
        return self.held


class Rollout(Worker):
    def __init__(self) -> None:
        self.w = torch.zeros(WEIGHTS)

    def load_weights(self, weights: list[tuple[str, torch.Tensor]]) -> None:
        for _, t in weights:
            self.w.copy_(t)

    @register(Dispatch.ONE_TO_ALL)
    def reset(self) -> None:
        self.w.zero_()
        self.__dict__.pop("weights_version", None)

    @register(Dispatch.DP_COMPUTE_PROTO)
    @versioned
    def generate(self, prompts: DataProto) -> DataProto:
        time.sleep(float(prompts.batch["gen_s"].max()))
        n = len(prompts)
        version = weights_version_of(self) or 0
        return DataProto.from_dict({"tokens": torch.full((n, TOKENS), version, dtype=torch.int64)})


def _batches(steps: int, ranks: int, gen_s: float, sigma: float, seed: int) -> list[DataProto]:
    """Per batch one generation time, lognormal with mean ``gen_s`` (median ``gen_s / exp(sigma^2 / 2)``)."""
    g = torch.Generator().manual_seed(seed)
    mu = torch.log(torch.tensor(gen_s)) - sigma**2 / 2
    times = torch.exp(mu + sigma * torch.randn(steps * ranks, generator=g))
    return [DataProto.from_dict({"gen_s": torch.full((ROWS,), float(t))}) for t in times]


def run_sync(trainer: WorkerGroup, rollout: WorkerGroup, batches: list[DataProto]) -> tuple[float, list[int]]:
    ranks = rollout.world_size
    sync = WeightSync(trainer, rollout)
    start = time.perf_counter()
    for step in range(len(batches) // ranks):
        data = rollout.generate(DataProto.concat(batches[step * ranks : (step + 1) * ranks]))
        trainer.train(data)
        sync(version=step + 1)
    return time.perf_counter() - start, [0] * len(batches)


def run_async(
    trainer: WorkerGroup, rollout: WorkerGroup, stage: WorkerGroup | None, batches: list[DataProto], k: int
) -> tuple[float, list[int]]:
    """``stage=None``: each rollout rank syncs from the trainer itself (its steps queue behind training)."""
    ranks = rollout.world_size
    staleness: list[int] = []
    start = time.perf_counter()
    stream = RolloutStream(
        rollout.generate, itertools.cycle(batches), policy=MaxStaleness(k, on_stale="drop"), batches_per_step=ranks,
        weights_from=trainer if stage is None else stage,
        snapshot=None if stage is None else WeightSync(trainer, stage),
    )  # fmt: skip
    for step in range(len(batches) // ranks):
        taken = stream.take(timeout=120)
        staleness += taken.staleness
        trainer.train(taken.data)
        stream.publish(step + 1)
    elapsed = time.perf_counter() - start
    stream.close()
    staleness += [-1] * len(stream.evicted)  # -1: dropped as too stale (generated, never trained on)
    return elapsed, staleness


def _reset(trainer: WorkerGroup, rollout: WorkerGroup, stage: WorkerGroup) -> None:
    trainer.reset()
    rollout.reset()
    WeightSync(trainer, stage)(version=0)
    WeightSync(stage, rollout)(version=0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="torchrun")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--gen-ms", type=float, default=100.0)
    parser.add_argument("--train-ms", type=float, default=100.0)
    parser.add_argument("--sigma", type=float, default=0.8)
    args = parser.parse_args()
    rounds, steps = (2, 8) if args.quick else (3, 16)
    modes = ["sync", "k=0", "k=1", "k=2", "k=1 no stage"]
    rate: dict[str, list[float]] = collections.defaultdict(list)
    hist: dict[str, collections.Counter[int]] = collections.defaultdict(collections.Counter)
    with (
        WorkerGroup(Trainer, 1, backend=args.backend, init_kwargs={"train_s": args.train_ms / 1e3}) as trainer,
        WorkerGroup(Rollout, args.ranks, backend=args.backend) as rollout,
        WorkerGroup(Stage, 1, backend=args.backend) as stage,
    ):
        for r in range(rounds):
            batches = _batches(steps, args.ranks, args.gen_ms / 1e3, args.sigma, seed=r)
            for mode in modes:
                _reset(trainer, rollout, stage)
                if mode == "sync":
                    elapsed, stale = run_sync(trainer, rollout, batches)
                else:
                    k, direct = int(mode[2]), mode.endswith("no stage")
                    elapsed, stale = run_async(trainer, rollout, None if direct else stage, batches, k)
                rate[mode].append(len(batches) * ROWS / elapsed)  # samples trained on per second
                hist[mode].update(stale)
                print(f"round {r} {mode}: {rate[mode][-1]:.1f} samples/s", flush=True)
    base = statistics.median(rate["sync"])
    rows = []
    for mode in modes:
        median = statistics.median(rate[mode])
        shown = ", ".join(f"{'dropped' if s < 0 else s}: {n}" for s, n in sorted(hist[mode].items()))
        rows.append([mode, f"{median:.1f}", f"{median / base:.2f}", shown])
    print_table(
        f"{args.backend}, {args.ranks} rollout ranks, generation mean {args.gen_ms:g} ms (lognormal sigma "
        f"{args.sigma:g}), training {args.train_ms:g} ms, {steps} steps x {rounds} rounds",
        ["mode", "samples/s (median)", "x sync", "staleness histogram (batches)"],
        rows,
    )


if __name__ == "__main__":
    main()
