"""The driver: a verl-shaped RL post-training loop written once against the public API.

Every step: generate -> reward -> reference log-probs -> group-baseline
advantages -> update.  The same function runs on ``local``, ``ray`` and
``torchrun``; only the ``backend`` argument changes.  With ``lazy=True`` the
DataProto-returning calls leave their rows on the ranks: the driver passes
references on and reads only the ``rewards`` column; the numbers are the same.
With ``rollout_ranks=K`` a separate group of K ranks generates, its weights
synced from the actor by ``WeightSync`` at the start of every step.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

import torch

from .. import (
    DataProto,
    DispatchValueError,
    Tracer,
    WeightSync,
    Worker,
    WorkerGroup,
    available_backends,
    create_colocated_worker_cls,
    driver_traffic,
    trace,
)
from .._cli._report import OneLineParser, run_reporting_expected_errors
from .cli import add_arguments, is_driver
from .task import make_prompts
from .workers import ActorWorker, ModelConfig, ReferenceWorker, RewardWorker, RolloutWorker


@dataclass
class DemoConfig:
    backend: str = "local"
    world_size: int = 2
    steps: int = 30
    prompts_per_step: int = 31  # odd on purpose: batches that do not divide get padded
    samples_per_prompt: int = 4
    length: int = 6
    shift: int = 3
    lr: float = 0.05
    kl_coef: float = 0.01
    seed: int = 0
    checkpoint: str | None = None
    #: "replace": a dead rank is replaced and the interrupted call retried (backends that can).
    on_rank_death: str = "raise"
    #: Results of generate / reward / reference log-probs stay on the ranks (lazy DataProto).
    lazy: bool = False
    #: Ranks of a separate rollout group (weights synced from the actor every step); None: the actor generates.
    rollout_ranks: int | None = None
    #: ``{step: change}``: the rollout group grows (+k) or loses its highest ranks (-k) before that step.
    resize: dict[int, int] = field(default_factory=dict)
    backend_options: dict[str, Any] = field(default_factory=dict)


@dataclass
class StepMetrics:
    step: int
    reward: float
    loss: float
    kl: float
    dispatch_s: float
    compute_s: float
    collect_s: float
    step_s: float
    #: DataProto payload bytes that crossed the driver during the step (sent + received).
    driver_bytes: int = 0
    #: The rollout group's size during the step (``None``: the actor generates).
    rollout_ranks: int | None = None


def group_baseline_advantages(scores: torch.Tensor, samples: int) -> torch.Tensor:
    """GRPO-style: each sample's reward minus the mean of its prompt's samples."""
    grouped = scores.view(-1, samples)
    return (grouped - grouped.mean(dim=1, keepdim=True)).reshape(-1)


def phase_seconds(tracer: Tracer, since: int) -> tuple[float, float, float]:
    """(dispatch, compute, collect) seconds of the calls recorded after event ``since`` (a call's slowest rank)."""
    compute: dict[int, float] = {}
    for event in tracer.events[since:]:
        if event.get("ph") == "X" and event.get("args", {}).get("phase") == "compute":
            key = event["args"]["call"]
            compute[key] = max(compute.get(key, 0.0), event["dur"])
    totals = tracer.phase_totals(since)
    return totals.get("dispatch", 0.0), sum(compute.values()) / 1e6, totals.get("collect", 0.0)


def run_demo(
    config: DemoConfig,
    on_step: Callable[[StepMetrics], None] | None = None,
    trace_path: str | None = None,
    on_ready: Callable[[], None] | None = None,
) -> list[StepMetrics]:
    """Train for ``config.steps`` steps; returns the per-step metrics.

    ``on_ready`` runs once the groups are up and their setup calls done, just
    before the first step: start-up and training are then timed apart.
    """
    n = config.world_size
    replicas = 2 if n % 2 == 0 else 1
    model = ModelConfig(length=config.length, lr=config.lr, kl_coef=config.kl_coef, seed=config.seed)
    generator = torch.Generator().manual_seed(config.seed)
    history: list[StepMetrics] = []
    actor_ref_cls = create_colocated_worker_cls({"actor": ActorWorker, "ref": ReferenceWorker})
    options = {"backend": config.backend, "on_rank_death": config.on_rank_death, **config.backend_options}
    with trace(trace_path) as tracer, contextlib.ExitStack() as groups:
        actor_ref = groups.enter_context(WorkerGroup(actor_ref_cls, n, **options))
        reward_wg = groups.enter_context(WorkerGroup(RewardWorker, n, **options))
        roles = actor_ref.spawn({"actor", "ref"})
        actor, ref = roles["actor"], roles["ref"]
        actor.init_model(model)
        ref.init_model(model, replicas)
        reward_wg.init_task(config.shift)
        generate, sync, rollout = actor.generate_sequences, None, None
        if config.rollout_ranks is not None:  # a separate rollout group, its weights synced from the actor
            spares = sum(c for c in config.resize.values() if c > 0) if config.backend == "torchrun" else 0
            extra: dict[str, Any] = {"spare_ranks": spares} if spares else {}
            rollout = groups.enter_context(WorkerGroup(RolloutWorker, config.rollout_ranks, **options, **extra))
            rollout.init_model(model)
            generate, sync = rollout.generate_sequences, WeightSync(actor, rollout)
        compute_reward, compute_ref = reward_wg.compute_reward, ref.compute_ref_log_prob
        calls = tuple(
            proxy.options(lazy=True) if config.lazy else proxy for proxy in (generate, compute_reward, compute_ref)
        )
        if on_ready is not None:
            on_ready()
        for step in range(1, config.steps + 1):
            if rollout is not None and step in config.resize:
                _resize(rollout, config.resize[step], sync, step - 1)
            metrics = _step(step, config, tracer, generator, calls, actor, sync)
            metrics.rollout_ranks = None if rollout is None else rollout.world_size
            history.append(metrics)
            if on_step is not None:
                on_step(metrics)
        if config.checkpoint:
            actor.save_checkpoint(config.checkpoint)
    return history


def _resize(rollout: WorkerGroup[Any], change: int, sync: WeightSync | None, version: int) -> None:
    """Grow the rollout group by ``change`` ranks (the actor's weights into them first), or remove its highest."""
    if change > 0:
        rollout.grow(change, sync=sync, version=version)
    else:
        size = rollout.world_size
        rollout.shrink(*range(max(1, size + change), size))


def _step(
    step: int,
    config: DemoConfig,
    tracer: Tracer,
    generator: torch.Generator,
    calls: tuple[Any, ...],
    actor: Any,
    sync: WeightSync | None = None,
) -> StepMetrics:
    """One RL step: (weight sync), generate, reward, reference log-probs, advantages on the driver, update."""
    generate, compute_reward, compute_ref = calls
    since, started = len(tracer.events), time.perf_counter()
    traffic_before = driver_traffic()
    if sync is not None:
        sync(version=step)
    prompts = make_prompts(config.prompts_per_step, config.length, generator)
    prompts = prompts.repeat_interleave(config.samples_per_prompt, dim=0)
    batch = DataProto.from_dict({"prompts": prompts}, auto_padding=True)
    batch = batch.union(generate(batch))
    batch = batch.union(compute_reward(batch))
    batch = batch.union(compute_ref(batch))
    scores = batch.batch["rewards"]
    batch.batch["advantages"] = group_baseline_advantages(scores, config.samples_per_prompt)
    batch.meta_info["total_rows"] = len(batch)
    per_rank = actor.update_actor(batch)
    rows = sum(m["rows"] for m in per_rank)
    dispatch, compute, collect = phase_seconds(tracer, since)
    return StepMetrics(
        step=step,
        reward=float(scores.mean()),
        loss=sum(m["loss_sum"] for m in per_rank) / rows,
        kl=sum(m["kl_sum"] for m in per_rank) / rows,
        dispatch_s=dispatch,
        compute_s=compute,
        collect_s=collect,
        step_s=time.perf_counter() - started,
        driver_bytes=(driver_traffic() - traffic_before).total,
    )


class ProgressTable:
    """Live display: a progress bar on a terminal, then one table row per step."""

    def __init__(self, total: int, out: TextIO | None = None) -> None:
        out = out or sys.stdout  # looked up per table, so redirected stdout (tests, tools) is honoured
        self.total, self.out = total, out
        self.tty = out.isatty()
        self.rollout_ranks: int | None = None
        header = (
            f"{'step':>5} {'reward':>7} {'loss':>8} {'kl':>8} {'dispatch':>9} {'compute':>9} {'collect':>9} "
            f"{'step':>8} {'via driver':>10}"
        )
        print(header, file=out)
        print("-" * len(header), file=out, flush=True)

    def __call__(self, m: StepMetrics) -> None:
        if self.tty:
            print("\r\033[K", end="", file=self.out)
        if m.rollout_ranks != self.rollout_ranks and self.rollout_ranks is not None:
            print(f"      rollout group: {self.rollout_ranks} -> {m.rollout_ranks} ranks", file=self.out)
        self.rollout_ranks = m.rollout_ranks
        print(
            f"{m.step:>5} {m.reward:>7.3f} {m.loss:>8.4f} {m.kl:>8.4f} {m.dispatch_s * 1e3:>7.1f}ms "
            f"{m.compute_s * 1e3:>7.1f}ms {m.collect_s * 1e3:>7.1f}ms {m.step_s * 1e3:>6.0f}ms "
            f"{m.driver_bytes / 1024:>8.1f}KB",
            file=self.out,
        )
        if self.tty and m.step < self.total:
            done = int(30 * m.step / self.total)
            print(f"[{'#' * done}{'.' * (30 - done)}] step {m.step}/{self.total}", end="", file=self.out)
        self.out.flush()


class RunClock:
    """Start-up (groups, workers, setup calls) and training timed apart: a step is milliseconds, start-up seconds."""

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.ready_at: float | None = None

    def ready(self) -> None:
        self.ready_at = time.perf_counter()

    def summary(self, history: Sequence[StepMetrics]) -> str:
        """E.g. ``reward 0.09 -> 0.97; start-up 3.1s, 30 steps in 0.4s (12.0 ms a step, median), shutdown 0.5s``."""
        ended = time.perf_counter()
        ready = self.ready_at if self.ready_at is not None else self.started
        steps = sorted(m.step_s for m in history)
        median = steps[len(steps) // 2] if steps else 0.0
        training = sum(steps)
        shutdown = max(0.0, ended - ready - training)
        first, last = (history[0].reward, history[-1].reward) if history else (0.0, 0.0)
        return (
            f"\nreward {first:.3f} -> {last:.3f}; start-up {ready - self.started:.1f}s, "
            f"{len(history)} steps in {training:.2f}s ({median * 1e3:.1f} ms a step, median), "
            f"shutdown {shutdown:.1f}s"
        )


def run(args: argparse.Namespace) -> int:
    backend = args.backend or os.environ.get("DISPATCHCORE_BACKEND") or "local"
    world_size = args.world_size
    if world_size is None:
        launched = os.environ.get("WORLD_SIZE") if os.environ.get("TORCHELASTIC_RUN_ID") else None
        world_size = int(launched) if launched else 2
    config = DemoConfig(
        backend=backend,
        world_size=world_size,
        steps=args.steps,
        seed=args.seed,
        checkpoint=args.checkpoint,
        lazy=args.lazy,
        rollout_ranks=args.rollout_ranks,
        resize=args.resize,
    )
    if config.resize and config.rollout_ranks is None:
        raise DispatchValueError("--resize changes the rollout group's size: give it one with --rollout-ranks K")
    if backend not in available_backends():
        WorkerGroup(Worker, 1, backend=backend)  # raises BackendNotFoundError with its fix, before any output
    driver = is_driver()
    if driver:
        print(
            f"dispatchcore demo: backend={backend} world_size={world_size} steps={config.steps} "
            f"lazy={'on' if config.lazy else 'off'} "
            f"rollout={config.rollout_ranks if config.rollout_ranks else 'actor'} "
            f"(task: shift {config.length} digits by {config.shift}; reward = fraction right)",
            flush=True,
        )
    clock = RunClock()
    history = run_demo(
        config, on_step=ProgressTable(config.steps) if driver else None, trace_path=args.trace, on_ready=clock.ready
    )
    print(clock.summary(history), flush=True)
    if args.trace:
        print(f"trace written to {args.trace} (open it in https://ui.perfetto.dev)")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m dispatchcore.demo", description=__doc__)
    add_arguments(parser)
    return run_reporting_expected_errors(run, parser.parse_args(argv))
