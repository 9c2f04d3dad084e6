"""Fault-suite fixtures: figures for RELIABILITY.md and leak checks.

Set ``DISPATCHCORE_RELIABILITY_OUT=path.jsonl`` and every ``record(...)``
appends one JSON line there (``scripts/reliability_report.py`` turns the
lines into RELIABILITY.md); unset, ``record`` only checks its input.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from typing import Any

import pytest

_LOCK = threading.Lock()


def _write(table: str, row: dict[str, Any]) -> None:
    path = os.environ.get("DISPATCHCORE_RELIABILITY_OUT")
    line = json.dumps({"table": table, **row}, default=str, sort_keys=True)
    if path:
        with _LOCK, open(path, "a") as f:
            f.write(line + "\n")


@pytest.fixture
def record() -> Callable[..., None]:
    """``record(table, **row)``: one row of RELIABILITY.md (``table`` is e.g. ``"faults/ray"``)."""
    return _write
