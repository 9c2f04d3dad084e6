"""The rank a worker is being built for: a thread-local context ``Worker.__new__`` reads.

:class:`~dispatchcore.executor.WorkerHost` builds each worker inside
:func:`rank_context`, so ``self.rank`` and ``self.world_size`` are right from
the first line of a subclass's ``__init__`` (verl sets them only after); a
worker built any other way falls back to the ``RANK`` / ``WORLD_SIZE``
environment.  It imports nothing, so the rank runtime needs no worker class.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from typing import Any

_context = threading.local()


@contextlib.contextmanager
def rank_context(rank: int, world_size: int) -> Iterator[None]:
    """Make workers built inside this block see ``rank`` / ``world_size``."""
    previous = getattr(_context, "current", None)
    _context.current = (rank, world_size)
    try:
        yield
    finally:
        _context.current = previous


def swap_collective(current: tuple[Any, int, int] | None) -> tuple[Any, int, int] | None:
    """Make :mod:`dispatchcore.collective` on this thread use ``current`` (link, rank, world size); the one before.

    ``WorkerHost`` sets it around a worker's ``__init__`` and every method it
    runs, so a free function inside a method finds its rank's group even where
    one thread serves several groups (a torchrun process).
    """
    previous: tuple[Any, int, int] | None = getattr(_context, "collective", None)
    _context.collective = current
    return previous


def current_collective() -> tuple[Any, int, int] | None:
    """(link, rank, world size) of the worker method running on this thread; ``None`` outside one."""
    found: tuple[Any, int, int] | None = getattr(_context, "collective", None)
    return found


def current_rank_context() -> tuple[int, int]:
    """(rank, world_size) for a worker being built now."""
    found: tuple[int, int] | None = getattr(_context, "current", None)
    if found is not None:
        return found
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


class CancelFlag:
    """Whether the call a rank is running was asked to stop (set from another thread), and its collective link."""

    __slots__ = ("link", "requested")

    def __init__(self) -> None:
        self.requested = False
        #: The ``CollectiveLink`` the call's collectives run on: a cancel aborts it (``_runtime/_cancel.py``).
        self.link: Any = None


def call_cancelled() -> bool:
    """Whether the call this thread runs was cancelled; ``False`` outside a call."""
    flag: CancelFlag | None = getattr(_context, "cancel", None)
    return flag is not None and flag.requested


def current_call() -> CancelFlag | None:
    """The flag of the call this thread runs (one object per call); ``None`` outside a call."""
    flag: CancelFlag | None = getattr(_context, "cancel", None)
    return flag


def enter_method(flag: CancelFlag, collective: tuple[Any, int, int]) -> tuple[Any, Any]:
    """Both per-call thread settings at once (the cancel flag, the collective): what they were before.

    One function on every call of every rank instead of two, each way (see :func:`leave_method`).
    """
    context = _context
    previous = (getattr(context, "cancel", None), getattr(context, "collective", None))
    context.cancel = flag
    context.collective = collective
    flag.link = collective[0]
    return previous


def leave_method(previous: tuple[Any, Any]) -> None:
    """Put back what :func:`enter_method` replaced."""
    _context.cancel, _context.collective = previous
