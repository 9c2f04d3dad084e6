"""``LaneExecutor``: an executor whose ranks are processes on the core's lane; the backend only hosts them.

See ``docs/executor-contract.md`` ("The lane").
"""

from __future__ import annotations

import atexit
from abc import abstractmethod
from collections.abc import Sequence

from .._base import DispatchError
from .._runtime import unpicklable_spec_error
from .._spi import LOOPBACK, Call, Executor, GroupSpec
from .._wire import Serialized, dumps
from ._address import LaneAddress
from ._driver import REASON_WAIT_S, LaneCallHandle, LaneDriver
from ._envelope import BulkPath


class LaneExecutor(Executor):
    """``submit``, ``cancel_call``, ``rank_stacks``, ``shutdown`` on the core's lane (docs/executor-contract.md)."""

    #: Where the lane listens: an address every rank reaches (loopback when all share this machine); a backend that
    #: learns it only once its ranks are placed sets it before the first :meth:`open_ranks`.
    lane_host: str = LOOPBACK
    #: How long a closed link waits for :meth:`rank_dead` to say why (longer where the death signal comes late).
    lane_reason_wait: float = REASON_WAIT_S

    def __init__(self, spec: GroupSpec, *, bulk: BulkPath | None = None) -> None:
        super().__init__(spec)
        self._closed = False
        try:  # the worker class and init arguments as every rank gets them: pickled before any process starts
            self._boot = dumps((spec.worker_cls, tuple(spec.init_args), dict(spec.init_kwargs)))
        except Exception as exc:
            raise unpicklable_spec_error(spec, exc) from exc
        self._bulk_path = bulk
        self._lane: LaneDriver | None = None
        atexit.register(self.shutdown)  # before multiprocessing's own exit hook joins the ranks

    @property
    def lane(self) -> LaneDriver:
        """The core's lane to this group's ranks, made on first use on ``lane_host``."""
        if self._lane is None:
            self._lane = LaneDriver(
                self.lane_host,
                death_timeout=self.spec.death_timeout,
                on_broken=self.mark_broken,
                rank_dead=self.rank_dead,
                on_gone=self.rank_gone,
                bulk=self._bulk_path,
                isolate=self.spec.isolate,
                name=self.spec.name,
                reason_wait=self.lane_reason_wait,
            )
        return self._lane

    @property
    def boot(self) -> Serialized:
        """The worker class and init arguments as every rank gets them, pickled once (``LaneDriver.start`` takes it)."""
        return self._boot

    @abstractmethod
    def launch_ranks(self, ranks: Sequence[int], address: LaneAddress) -> None:
        """Start ``ranks``' processes; each runs ``LaneRank(rank, ...).serve(address)`` (pass ``address.encode()``)."""

    @abstractmethod
    def stop_ranks(self) -> None:
        """Release every rank process this executor started (their lane links are closed already)."""

    def rank_dead(self, rank: int) -> str | None:
        """Why ``rank``'s process is certainly gone (e.g. ``"its process exited with code -9"``), else ``None``."""
        return None

    def rank_gone(self, rank: int, reason: str) -> None:
        """The lane found ``rank`` gone (``reason`` says how); a backend may tell others that wait on it."""

    def open_ranks(self, ranks: Sequence[int], timeout: float) -> None:
        """Launch ``ranks``, accept their links and build their workers, within ``timeout`` seconds each step."""
        ranks = tuple(ranks)
        self.lane.join(ranks, lambda address: self.launch_ranks(ranks, address), timeout)
        self.lane.start(ranks, self._boot, self.spec.world_size, timeout)

    @property
    def closed(self) -> bool:
        """Whether :meth:`shutdown` ran."""
        return self._closed

    def submit(self, call: Call) -> LaneCallHandle:
        if self._closed:
            raise DispatchError(f"this {self.name} group is shut down")
        return self.lane.submit(call)

    def cancel_call(self, call: Call, ranks: Sequence[int]) -> bool:
        return not self._closed and self.lane.cancel(call.instructions.call_id, ranks)

    def rank_stacks(self, ranks: Sequence[int], all_threads: bool, timeout: float) -> dict[int, str]:
        return {} if self._closed else self.lane.stacks(ranks, all_threads, timeout)

    def can_replace_ranks(self) -> bool:
        return not self._closed and super().can_replace_ranks()

    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.shutdown)
        if self._lane is not None:
            self._lane.close()
        self.stop_ranks()
