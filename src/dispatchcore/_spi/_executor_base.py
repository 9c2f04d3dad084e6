"""The executor contract's base classes (the contract is written out once, in ``docs/executor-contract.md``)."""

from __future__ import annotations

import dataclasses
import importlib.util
import time
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from .._base import DispatchError

if TYPE_CHECKING:
    from .._wire import RowBuffers
    from ._call import Call
    from ._row_pieces import ChunkPlan, ResultShape


@dataclass(frozen=True)
class GroupSpec:
    """Everything an executor needs to start a group's ranks."""

    worker_cls: type
    world_size: int
    init_args: tuple[Any, ...] = ()
    init_kwargs: Mapping[str, Any] = field(default_factory=dict)
    isolate: bool = True
    call_timeout: float | None = None
    death_timeout: float = 60.0
    options: Mapping[str, Any] = field(default_factory=dict)
    #: A readable name, unique per process, for actors/threads/stores.
    name: str = "group"
    #: Every method name a call may ask for (``@register`` ones, colocated roles', the core's own).
    methods: tuple[str, ...] = ()


class CallHandle(ABC):
    """An in-flight call; one per :meth:`Executor.submit` (most subclass ``RankCallHandle``)."""

    #: Receive buffers the results' tensors were placed in (collect may adopt them instead of copying).
    row_buffers: RowBuffers | None = None

    @abstractmethod
    def result(self, timeout: float | None = None) -> list[Any]:
        """Per-rank results in the order of ``call.ranks``; past ``timeout``, ``DispatchTimeoutError``."""

    @abstractmethod
    def done(self) -> bool:
        """Whether :meth:`result` would return (or raise) without waiting."""


class Executor(ABC):
    """Base class of every backend (see ``docs/executor-contract.md``)."""

    #: Backend name users pass as ``backend=``.
    name: ClassVar[str] = ""
    #: The ``dispatchcore[extra]`` that installs this backend's needs, if any.
    extra: ClassVar[str | None] = None
    #: Top-level modules that must be importable (checked without importing).
    requires: ClassVar[tuple[str, ...]] = ()
    #: Whether every rank of a group is a thread of one process (``dispatchcore.collective`` reduces in memory).
    ranks_share_process: ClassVar[bool] = False

    def __init__(self, spec: GroupSpec) -> None:
        self.spec = spec
        self._broken: str | None = None

    @classmethod
    def missing_requirements(cls) -> list[str]:
        """Modules of :attr:`requires` that cannot be found."""
        return [m for m in cls.requires if importlib.util.find_spec(m) is None]

    @classmethod
    def launch_world_size(cls) -> int | None:
        """World size implied by how the program was launched (torchrun), if any."""
        return None

    @abstractmethod
    def submit(self, call: Call) -> CallHandle:
        """Start ``call`` on its ranks and return at once."""

    @abstractmethod
    def shutdown(self) -> None:
        """Release every rank; idempotent; must return promptly."""

    # -- optional: rows moved rank to rank instead of through the driver ----
    def describe_results(self, handle: CallHandle) -> list[ResultShape | None] | None:
        """Row count and ``meta_info`` of each rank's result, to forward it; ``None``: resolve on the driver."""
        return None

    def forward_chunk(self, handle: CallHandle, plan: ChunkPlan) -> Any:
        """A placeholder argument that resolves, on the receiving rank, to ``plan``'s rows."""
        raise NotImplementedError(f"{type(self).__name__} describes results but cannot forward chunks")

    # -- optional: lazy results read rank to rank --------------------------------
    def row_address(self, rank: int) -> Any:
        """Where rank ``rank``'s kept rows live, for :meth:`can_fetch_rows`; ``None``: through the driver."""
        return None

    def can_fetch_rows(self, address: Any) -> bool:
        """Whether this group's ranks can fetch rows kept at ``address`` (another group's :meth:`row_address`)."""
        return False

    # -- optional: weight transfers rank to rank (WeightSync) ---------------------------
    def tensor_address(self) -> Any:
        """Where this group's ranks publish transfers, for :meth:`can_receive_tensors`; ``None``: through the driver."""
        return None

    def can_receive_tensors(self, address: Any) -> bool:
        """Whether this group's ranks' ``tensor_link`` reads tokens published at ``address`` (another group's)."""
        return False

    # -- optional: replacing dead ranks (WorkerGroup.replace_rank) ----------------
    def replace_ranks(self, ranks: Sequence[int]) -> dict[str, str]:
        """Start new ranks in place of dead (or hung: kill them first) ones; the rendezvous variables every rank adopts.

        The default raises (see ``docs/replacing-ranks.md``).
        """
        raise DispatchError(f"the {self.name!r} backend cannot replace ranks; shut the group down and create a new one")

    # -- optional: growing and shrinking a group (WorkerGroup.grow / shrink) -------------
    def add_ranks(self, count: int) -> dict[str, str]:
        """Start ``count`` ranks numbered from the current world size, their workers built at the new size.

        Returns the rendezvous variables every rank adopts; the default
        raises (see ``docs/elastic-groups.md``).
        """
        raise DispatchError(f"the {self.name!r} backend cannot add ranks to a running group; create a larger group")

    def remove_ranks(self, ranks: Sequence[int]) -> dict[str, str]:
        """Stop ``ranks`` (idle: the core waited for their calls) and number the others ``0..n-1`` in order.

        Returns the rendezvous variables every remaining rank adopts; the default raises.
        """
        raise DispatchError(f"the {self.name!r} backend cannot remove ranks from a running group; create a smaller one")

    def resize_spec(self, world_size: int) -> None:
        """Record the group's new size in :attr:`spec` (for :meth:`add_ranks` / :meth:`remove_ranks`)."""
        self.spec = dataclasses.replace(self.spec, world_size=world_size)

    # -- optional: where each rank is (WorkerGroup.rank_stacks, notes on timeouts) ----
    def rank_stacks(self, ranks: Sequence[int], all_threads: bool, timeout: float) -> dict[int, str]:
        """The current Python stack of each of ``ranks`` answering within ``timeout``, read while a method runs."""
        return {}

    # -- optional: stopping a running call (future.cancel(), fail fast, a stream left early) ----
    def cancel_call(self, call: Call, ranks: Sequence[int]) -> bool:
        """Ask ``ranks`` to stop running ``call``, without waiting; whether the request was sent (default: cannot)."""
        return False

    def can_replace_ranks(self) -> bool:
        """Whether :meth:`replace_ranks` can start ranks now (default: whether the class overrides it)."""
        return type(self).replace_ranks is not Executor.replace_ranks

    def mark_usable(self) -> None:
        """Take calls again after :meth:`replace_ranks` restored every rank."""
        self._broken = None

    def mark_broken(self, reason: str) -> None:
        """Refuse every later call (the first reason given is kept and reported)."""
        if self._broken is None:
            self._broken = reason

    @property
    def broken(self) -> str | None:
        """Why this group can take no more calls, or ``None`` while it can."""
        return getattr(self, "_broken", None)


def remaining(deadline: float | None) -> float | None:
    """Seconds left until ``deadline`` (a ``time.monotonic()`` value)."""
    return None if deadline is None else max(0.0, deadline - time.monotonic())
