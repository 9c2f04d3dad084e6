"""The worker base class and the rank context it is built in.

``self.rank`` and ``self.world_size`` must be right from the first line of a
subclass's ``__init__`` (verl sets them only after).  Executors build workers
through :class:`dispatchcore.WorkerHost`, which publishes the rank in a
thread-local context that :meth:`Worker.__new__` reads; a worker built any
other way falls back to the ``RANK`` / ``WORLD_SIZE`` environment.
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


def current_rank_context() -> tuple[int, int]:
    """(rank, world_size) for a worker being built now."""
    found = getattr(_context, "current", None)
    if found is not None:
        return found
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


class Worker:
    """Base class of every worker; subclass it and decorate methods with ``@register``."""

    _rank: int
    _world_size: int
    _dispatch_collect_info: dict[str, tuple[int, bool]]

    def __new__(cls, *args: Any, **kwargs: Any) -> Worker:
        self = super().__new__(cls)
        self._rank, self._world_size = current_rank_context()
        self._dispatch_collect_info = {}
        return self

    @property
    def rank(self) -> int:
        """This worker's rank in its group (0 .. world_size-1)."""
        return self._rank

    @property
    def world_size(self) -> int:
        """Number of ranks in this worker's group."""
        return self._world_size

    def _register_dispatch_collect_info(self, mesh_name: str, dp_rank: int, is_collect: bool) -> None:
        """Declare this rank's data-parallel rank on ``mesh_name`` (verl's name).

        The nd dispatch mode of that mesh gives every rank with the same
        ``dp_rank`` the same chunk and collects only from ``is_collect`` ranks.
        """
        if not isinstance(dp_rank, int) or dp_rank < 0:
            raise ValueError(f"dp_rank must be an int >= 0, got {dp_rank!r}")
        self._dispatch_collect_info[mesh_name] = (dp_rank, bool(is_collect))

    register_mesh = _register_dispatch_collect_info

    def _dispatchcore_mesh_info(self, mesh_name: str) -> tuple[int, bool]:
        """What the driver asks once per mesh: (dp_rank, is_collect)."""
        try:
            return self._dispatch_collect_info[mesh_name]
        except KeyError:
            known = sorted(self._dispatch_collect_info)
            raise LookupError(
                f"rank {self.rank} registered no mesh {mesh_name!r} (known: {known}); call "
                f"self._register_dispatch_collect_info({mesh_name!r}, dp_rank, is_collect) "
                "in the worker before using its nd dispatch mode"
            ) from None
