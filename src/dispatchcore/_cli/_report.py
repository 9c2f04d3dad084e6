"""Expected errors on one line, for ``dispatchcore`` and ``python -m dispatchcore.demo`` alike.

A mistyped flag needs the fix, not a traceback into the library; a worker's own
exception (``WorkerError``) and any other error keep theirs: those are bugs to read.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, NoReturn

from .. import DispatchError, WorkerError

#: Exit status of an expected error (argparse's own for bad arguments).
USAGE_ERROR = 2
#: Shows the traceback of expected errors too.
TRACEBACK_ENV = "DISPATCHCORE_TRACEBACK"


class OneLineParser(argparse.ArgumentParser):
    """argparse, with a bad argument reported on one line that says where the help is."""

    def error(self, message: str) -> NoReturn:
        self.exit(USAGE_ERROR, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def run_reporting_expected_errors(command: Any, args: argparse.Namespace) -> int:
    """``command(args)``; an expected error becomes one line on stderr and exit status 2."""
    try:
        return int(command(args))
    except WorkerError:
        raise
    except DispatchError as exc:
        if os.environ.get(TRACEBACK_ENV):
            raise
        print(f"dispatchcore: error: {one_line(exc)}", file=sys.stderr)
        return USAGE_ERROR
    except KeyboardInterrupt:
        print("dispatchcore: interrupted", file=sys.stderr)
        return 130


def one_line(exc: BaseException) -> str:
    """The exception's message with its lines joined (notes, which hold details, left out)."""
    return " ".join(part.strip() for part in str(exc).splitlines() if part.strip()) or type(exc).__name__
