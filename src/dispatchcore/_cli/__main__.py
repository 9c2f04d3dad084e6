"""The ``dispatchcore`` console script: ``backends``, ``demo``, ``bench``.

Expected errors print one line and exit 2 (see ``_report``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from ._bench import run_benchmarks
from ._report import OneLineParser, run_reporting_expected_errors


def _backends(_: argparse.Namespace) -> int:
    from .._spi import registry

    rows = [("backend", "package", "status")]
    rows += [(info.name, f"{info.distribution or '?'} ({info.plugin})", info.status) for info in registry.all()]
    widths = [max(len(r[i]) for r in rows) for i in range(2)]
    for name, origin, status in rows:
        print(f"{name:<{widths[0]}}  {origin:<{widths[1]}}  {status}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="dispatchcore",
        description="dispatchcore's console script: list the backends, run the demo, run the benchmarks. "
        "Expected errors print one line and exit with status 2.",
    )
    commands = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    backends = commands.add_parser("backends", help="list the executors found and whether they can run here")
    backends.set_defaults(run=_backends)
    demo = commands.add_parser("demo", help="run a small RL post-training loop on a backend")
    from ..demo.cli import add_arguments
    from ..demo.loop import run as run_demo

    add_arguments(demo)
    demo.set_defaults(run=run_demo)
    bench = commands.add_parser("bench", help="run every executor's benchmark and print its ratio table")
    bench.add_argument("--quick", action="store_true", help="short version (a few minutes in all)")
    bench.add_argument("--only", action="append", choices=["local", "ray", "torchrun"], help="one executor")
    bench.add_argument("--out", type=Path, help="also write the tables into this page, dated (docs/benchmarks.md)")
    bench.set_defaults(run=lambda args: run_benchmarks(quick=args.quick, only=args.only, out=args.out))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return run_reporting_expected_errors(args.run, args)


if __name__ == "__main__":
    sys.exit(main())
