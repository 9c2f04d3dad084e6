"""Collectives between the ranks of one group: the rank side of :mod:`dispatchcore.collective`.

Where the ranks live decides how they reduce, and only the executor knows
it, so each executor hands every rank's :class:`~dispatchcore.executor.WorkerHost`
a :class:`CollectiveLink` (``host.collective``):

* :class:`ThreadCollective`: ranks that are threads of one process (one
  object shared by the group's ranks); they meet in memory and reduce in rank
  order, so every rank gets the same bits;
* :class:`StoreCollective`: ranks in processes of their own, with a
  ``torch.distributed`` store every rank reaches; a gloo group is built on a
  ``PrefixStore`` of it on first use (never ``init_process_group`` or
  ``new_group``: the default group is the user's), one per replacement
  generation;
* the plain :class:`CollectiveLink`: no store to offer; only the user's own
  default group can be used, and the error says so.

The user's default group, when one is initialized over exactly this group's
ranks, always wins on process backends: collectives then interleave in the
order the user expects with the user's own.
"""

from __future__ import annotations

import pickle
import threading
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any, ClassVar

from .._base import DispatchError, DispatchTimeoutError
from ._rank_context import call_cancelled

#: The reductions every path supports.
REDUCE_OPS = ("sum", "avg", "product", "min", "max")
#: How long a rank waits for the others in one collective (seconds) unless told otherwise.
DEFAULT_TIMEOUT_S = 300.0
#: Environment variable through which a process executor tells its ranks where its collective store is.
STORE_ENV = "DISPATCHCORE_COLLECTIVE_STORE"


class CollectiveLink:
    """How one rank's group runs collectives; the base offers no group of its own.

    ``backend`` is the executor's name (what :func:`dispatchcore.collective.rank_info`
    reports); ``shares_process`` is the executor's :attr:`~dispatchcore.executor.Executor.ranks_share_process`.
    """

    shares_process: ClassVar[bool] = False

    def __init__(self, backend: str, why_none: str = "") -> None:
        self.backend = backend
        self.generation = 0
        self._why_none = why_none

    def own_group(self, rank: int, world_size: int, timeout: float) -> Any | None:
        """A process group over the group's ranks built on the executor's store, or ``None`` (no store)."""
        return None

    def rebuild(self, generation: int) -> None:
        """After a replacement: later collectives use a fresh group (every rank agrees on ``generation``)."""
        self.generation = generation

    def missing_group_error(self) -> DispatchError:
        """What to do when there is neither a default group nor a store."""
        why = self._why_none or f"the {self.backend!r} backend gives its ranks no store to build a group on"
        return DispatchError(
            f"dispatchcore.collective found no process group: {why}; call "
            "torch.distributed.init_process_group('gloo') in the worker (its environment has RANK, "
            "WORLD_SIZE, MASTER_ADDR and MASTER_PORT) and dispatchcore.collective uses that default group"
        )


class ThreadCollective(CollectiveLink):
    """Ranks that are threads of one process: one object per group, shared by all its ranks."""

    shares_process: ClassVar[bool] = True

    def __init__(self, backend: str, world_size: int) -> None:
        super().__init__(backend)
        self.world_size = world_size
        self._cond = threading.Condition()
        self._arrived = 0
        self._round = 0
        self._slots: list[Any] = [None] * world_size

    def meet(self, timeout: float) -> None:
        """Wait until every rank of the group has arrived (a barrier that a cancel or a timeout leaves cleanly).

        Waits in short slices so a cancelled call (``Worker.cancelled``) and
        the interrupt that follows it land here instead of blocking in C.
        """
        deadline = time.monotonic() + timeout
        with self._cond:
            this_round = self._round
            self._arrived += 1
            if self._arrived == self.world_size:
                self._arrived, self._round = 0, self._round + 1
                self._cond.notify_all()
                return
            try:
                while self._round == this_round:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise DispatchTimeoutError(
                            f"a collective waited {timeout:.0f}s for the other ranks of its group"
                        )
                    if call_cancelled():
                        raise DispatchError("the call was cancelled while its rank waited in a collective")
                    self._cond.wait(min(left, 0.1))
            except BaseException:
                if self._round == this_round:
                    self._arrived -= 1
                raise

    def exchange(self, rank: int, value: Any, timeout: float) -> list[Any]:
        """Every rank's ``value``, in rank order.

        The values are the ranks' own objects: read them, then :meth:`meet`
        again before writing to your own, so nobody reads a value changed under it.
        """
        self._slots[rank] = value
        self.meet(timeout)
        return list(self._slots)


class StoreCollective(CollectiveLink):
    """Ranks in processes of their own, reaching one store (given, or at ``address`` and connected on first use)."""

    def __init__(self, backend: str, store: Any = None, address: tuple[str, int] | None = None) -> None:
        super().__init__(backend)
        self._store = store
        self._address = address
        self._group: Any = None
        self._built_for = -1
        self._lock = threading.Lock()

    @staticmethod
    def serve(host: str) -> tuple[Any, str]:
        """Driver side: a store for a group's ranks, on a free port of ``host``; (store, value for :data:`STORE_ENV`).

        Keep the store for the group's life and drop it at shutdown.  Its port
        is its own, never the ``MASTER_PORT`` the user's ``init_process_group``
        will take.
        """
        import torch.distributed as dist

        store = dist.TCPStore(host, 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=60))
        return store, f"{host}:{store.port}"

    @classmethod
    def from_environment(cls, backend: str, environ: dict[str, str] | Any) -> CollectiveLink:
        """The link a process executor announced in :data:`STORE_ENV` (``host:port``), else a plain one."""
        value = environ.get(STORE_ENV)
        if not value:
            return CollectiveLink(backend)
        host, _, port = value.rpartition(":")
        return cls(backend, address=(host, int(port)))

    def own_group(self, rank: int, world_size: int, timeout: float) -> Any | None:
        import torch.distributed as dist

        with self._lock:
            if self._group is None or self._built_for != self.generation:
                if self._store is None and self._address is not None:
                    host, port = self._address
                    self._store = dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=timeout))
                if self._store is None:
                    return None
                prefix = f"dispatchcore-collective/{self.generation}/"
                span = timedelta(seconds=timeout)
                self._group = dist.ProcessGroupGloo(dist.PrefixStore(prefix, self._store), rank, world_size, span)
                self._built_for = self.generation
            return self._group

    def rebuild(self, generation: int) -> None:
        with self._lock:
            super().rebuild(generation)
            self._group = None


def reduce_in_order(values: Sequence[Any], op: str) -> Any:
    """``values`` (tensors, rank order) reduced by ``op``; the same bits on every rank that computes it."""
    import torch

    total = values[0].clone()
    for other in values[1:]:
        if op in ("sum", "avg"):
            total += other
        elif op == "product":
            total *= other
        elif op == "min":
            torch.minimum(total, other, out=total)
        else:
            torch.maximum(total, other, out=total)
    if op == "avg":
        total /= len(values)
    return total


def pickled(value: Any) -> bytes:
    """An object as bytes for a broadcast between processes."""
    return pickle.dumps(value, protocol=5)
