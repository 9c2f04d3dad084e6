"""Command line of the demo."""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence

from .loop import DemoConfig, ProgressTable, run_demo


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--backend", default=None, help="local | ray | torchrun (default: DISPATCHCORE_BACKEND or local)"
    )
    parser.add_argument(
        "--world-size", type=int, default=None, help="ranks per group (default 2; torchrun: the launch)"
    )
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--trace", default=None, metavar="FILE", help="write a Chrome/Perfetto trace of the run")
    parser.add_argument("--checkpoint", default=None, metavar="FILE", help="save the trained policy (rank 0)")
    parser.add_argument(
        "--lazy",
        action="store_true",
        help="keep generate/reward/reference results on the ranks (lazy DataProto); same numbers, less driver traffic",
    )


def is_driver() -> bool:
    """Under torchrun every rank runs this script; only rank 0 drives (and prints)."""
    return not os.environ.get("TORCHELASTIC_RUN_ID") or os.environ.get("RANK", "0") == "0"


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
    )
    driver = is_driver()
    if driver:
        print(
            f"dispatchcore demo: backend={backend} world_size={world_size} steps={config.steps} "
            f"lazy={'on' if config.lazy else 'off'} "
            f"(task: shift {config.length} digits by {config.shift}; reward = fraction right)",
            flush=True,
        )
    started = time.perf_counter()
    history = run_demo(config, on_step=ProgressTable(config.steps) if driver else None, trace_path=args.trace)
    first, last = history[0].reward, history[-1].reward
    print(f"\nreward {first:.3f} -> {last:.3f} in {time.perf_counter() - started:.1f}s", flush=True)
    if args.trace:
        print(f"trace written to {args.trace} (open it in https://ui.perfetto.dev)")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dispatchcore.demo", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
