"""The demo's command-line options (a leaf: ``dispatchcore demo`` and ``python -m dispatchcore.demo`` share it)."""

from __future__ import annotations

import argparse
import os


def positive_int(text: str) -> int:
    """An argparse type: an integer of at least 1 (a bad one is reported on one line, before anything starts)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def resize_schedule(text: str) -> dict[int, int]:
    """An argparse type: ``STEP:+K`` / ``STEP:-K`` pairs, comma-separated (``10:+2,20:-1``), as ``{step: change}``."""
    schedule: dict[int, int] = {}
    for part in text.split(","):
        step, _, change = part.strip().partition(":")
        try:
            at, by = int(step), int(change)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected STEP:+K or STEP:-K pairs like 10:+2,20:-1, got {part!r}"
            ) from None
        if at < 1 or by == 0:
            raise argparse.ArgumentTypeError(f"{part!r}: the step must be at least 1 and the change not 0")
        schedule[at] = by
    return schedule


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backend", help="local | ray | torchrun (default: DISPATCHCORE_BACKEND or local)")
    parser.add_argument("--world-size", type=positive_int, help="ranks per group (default 2; torchrun: the launch)")
    parser.add_argument("--steps", type=positive_int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--trace", metavar="FILE", help="write a Chrome/Perfetto trace of the run")
    parser.add_argument("--checkpoint", metavar="FILE", help="save the trained policy (rank 0)")
    parser.add_argument(
        "--lazy",
        action="store_true",
        help="keep generate/reward/reference results on the ranks (lazy DataProto); same numbers, less driver traffic",
    )
    parser.add_argument(
        "--rollout-ranks",
        type=positive_int,
        metavar="K",
        help="generate on a separate group of K ranks, the actor's weights synced to it every step "
        "(default: the actor generates)",
    )
    parser.add_argument(
        "--resize",
        type=resize_schedule,
        metavar="SCHEDULE",
        default={},
        help="grow or shrink the rollout group before the steps named, e.g. 10:+2,20:-1 (needs --rollout-ranks; "
        "a shrink removes the highest ranks; torchrun starts the ranks it adds up front, as spares)",
    )


def is_driver() -> bool:
    """Under torchrun every rank runs this script; only rank 0 drives (and prints)."""
    return not os.environ.get("TORCHELASTIC_RUN_ID") or os.environ.get("RANK", "0") == "0"
