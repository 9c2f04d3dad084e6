"""The ``dispatchcore`` console script."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def _backends(_: argparse.Namespace) -> int:
    from ._plugins import registry

    rows = [("backend", "package", "status")]
    for info in registry.all():
        package = info.distribution or "?"
        origin = f"{package} ({info.plugin})"
        rows.append((info.name, origin, info.status))
    widths = [max(len(r[i]) for r in rows) for i in range(2)]
    for name, origin, status in rows:
        print(f"{name:<{widths[0]}}  {origin:<{widths[1]}}  {status}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dispatchcore", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    backends = commands.add_parser("backends", help="list the executors found and whether they can run here")
    backends.set_defaults(run=_backends)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.run(args))


if __name__ == "__main__":
    sys.exit(main())
