"""The executor contract's base classes: :class:`Executor`, :class:`GroupSpec`, :class:`CallHandle`.

The contract is written out once, in ``docs/executor-contract.md``.  In
short: a backend subclasses :class:`Executor`, sets :attr:`Executor.name` and
implements ``__init__(spec)`` (start ``spec.world_size`` ranks, each a
``WorkerHost``), :meth:`Executor.submit` (send a ``Call`` at once, return a
:class:`CallHandle`) and :meth:`Executor.shutdown`; :meth:`CallHandle.result`
is where every bound lives and never blocks forever.
"""

from __future__ import annotations

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
    #: Every method name a call may ask for: the ``@register`` methods, role
    #: methods of a colocated class (``"actor_update"``), and the core's own.
    methods: tuple[str, ...] = ()


class CallHandle(ABC):
    """An in-flight call; one per :meth:`Executor.submit`.

    Most executors subclass :class:`~dispatchcore.executor.RankCallHandle`,
    which implements :meth:`result` and :meth:`done` with every time bound.
    """

    #: Receive buffers the results' tensors were placed in, which the collect
    #: step may adopt instead of copying (see :class:`~dispatchcore.wire.RowBuffers`).
    row_buffers: RowBuffers | None = None

    @abstractmethod
    def result(self, timeout: float | None = None) -> list[Any]:
        """Per-rank results in the order of ``call.ranks``.

        ``timeout`` (seconds, ``None`` for no bound) limits the wait; past it,
        raise :class:`~dispatchcore.DispatchTimeoutError`.  Calling again after
        success returns the same list.
        """

    @abstractmethod
    def done(self) -> bool:
        """Whether :meth:`result` would return (or raise) without waiting."""


class Executor(ABC):
    """Base class of every backend (see the module docstring)."""

    #: Backend name users pass as ``backend=``.
    name: ClassVar[str] = ""
    #: The ``dispatchcore[extra]`` that installs this backend's needs, if any.
    extra: ClassVar[str | None] = None
    #: Top-level modules that must be importable (checked without importing).
    requires: ClassVar[tuple[str, ...]] = ()
    #: Whether every rank of a group is a thread of one process.  Declare it:
    #: ``dispatchcore.collective`` reduces in memory between such ranks (give
    #: their hosts one shared ``ThreadCollective``), and uses process groups
    #: between the others (give each host a ``StoreCollective`` on a store the
    #: ranks reach, or leave the plain link: then only the user's default group).
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
        """Row count and ``meta_info`` of each rank's result of ``handle``'s call.

        Called when a ``DataProtoFuture`` of this executor is passed into another
        call of this executor.  Return ``None`` (the default) to have the core
        resolve the future on the driver and chunk it; otherwise the core plans
        the chunks (:func:`~dispatchcore.executor.plan_forward`) and asks
        :meth:`forward_chunk` for each.  Never move the rows here.
        """
        return None

    def forward_chunk(self, handle: CallHandle, plan: ChunkPlan) -> Any:
        """A placeholder argument that resolves, on the receiving rank, to ``plan``'s rows.

        The placeholder comes back in a later :meth:`submit`; resolve it there
        (e.g. with :func:`~dispatchcore.executor.assemble_chunk`).
        """
        raise NotImplementedError(f"{type(self).__name__} describes results but cannot forward chunks")

    # -- optional: lazy results read rank to rank --------------------------------
    def row_address(self, rank: int) -> Any:
        """Where rank ``rank``'s kept rows live, for :meth:`can_fetch_rows` of a consuming group.

        Lazy results work on every executor: the core keeps them on the ranks
        (``WorkerHost``) and reads them to the driver with ordinary calls.  To
        let a consuming rank fetch rows from a producing rank directly, return
        a small picklable address here, answer :meth:`can_fetch_rows` for it,
        and set ``host.fetch_rows`` on each rank to a function taking
        :class:`~dispatchcore.executor.RowRequest` s (their ``address``) and
        returning one ``DataProto`` per request, read on the producing rank
        with :func:`~dispatchcore.executor.take_kept_rows`.  ``None`` (the
        default) sends consumers their rows through the driver.
        """
        return None

    def can_fetch_rows(self, address: Any) -> bool:
        """Whether this group's ranks can fetch rows kept at ``address`` (another group's :meth:`row_address`)."""
        return False

    # -- optional: weight transfers rank to rank (WeightSync) ---------------------------
    def tensor_address(self) -> Any:
        """Where this group's ranks publish a transfer's buckets, for :meth:`can_receive_tensors` of another group.

        To move a ``WeightSync``'s tensors rank to rank, set ``host.tensor_link``
        on each rank to a :class:`~dispatchcore.executor.TensorLink` (``publish``
        on the source rank gives a small token, ``receive`` on a destination
        rank the tensors back), return a small picklable address here and
        accept it in :meth:`can_receive_tensors`.  ``None`` (the default)
        moves them through the driver: correct, slow, counted by
        ``driver_traffic()``.
        """
        return None

    def can_receive_tensors(self, address: Any) -> bool:
        """Whether this group's ranks' ``tensor_link`` reads tokens published at ``address`` (another group's)."""
        return False

    # -- optional: replacing dead ranks (WorkerGroup.replace_rank) ----------------
    def replace_ranks(self, ranks: Sequence[int]) -> dict[str, str]:
        """Start new ranks ``ranks`` in place of dead (or hung: kill them first) ones.

        Run the worker's ``__init__`` on each new rank (with the rank
        variables of :func:`rank_environment` and a fresh rendezvous), point
        later calls at it, and return the rendezvous variables
        (``MASTER_ADDR``, ``MASTER_PORT``) every rank adopts to rebuild a
        ``torch.distributed`` world.  The core then replays setup calls and
        runs the membership hook, and clears the broken state.  Raise
        :class:`~dispatchcore.DispatchError` saying why when the backend
        cannot (the default).
        """
        raise DispatchError(f"the {self.name!r} backend cannot replace ranks; shut the group down and create a new one")

    # -- optional: where each rank is (WorkerGroup.rank_stacks, notes on timeouts) ----
    def rank_stacks(self, ranks: Sequence[int], all_threads: bool, timeout: float) -> dict[int, str]:
        """The current Python stack of each of ``ranks``, by rank: the thread running its methods.

        With ``all_threads`` every thread of the rank's process.  It must
        answer while a method is running (busy in Python or blocked in C),
        within ``timeout`` seconds: a rank that does not answer in time is
        left out.  Build the text with
        :func:`dispatchcore.executor.thread_stacks` where the rank lives.
        The default knows no rank (``{}``).
        """
        return {}

    # -- optional: stopping a running call (future.cancel(), fail fast, a stream left early) ----
    def cancel_call(self, call: Call, ranks: Sequence[int]) -> bool:
        """Ask ``ranks`` to stop running ``call``: on each, ``host.cancel(call.instructions.call_id)``.

        Send the request on the path that answers while a method runs (the
        one :meth:`rank_stacks` uses) and return at once, without waiting
        for the ranks; return whether it was sent.  The call's handle ends
        on its own; the core waits for the ranks to leave the call within the
        group's ``cancel_grace``, and restarts (:meth:`replace_ranks`) those
        that do not, where the backend can.  The default cannot ask
        (``False``): a rank then finishes the call in its own time.
        """
        return False

    def can_replace_ranks(self) -> bool:
        """Whether :meth:`replace_ranks` can start ranks now (the core asks before it restarts stuck ones).

        The default: whether this class overrides :meth:`replace_ranks`.  An
        executor that sometimes cannot (no spare, ranks it did not start)
        says so here.
        """
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
    if deadline is None:
        return None
    return max(0.0, deadline - time.monotonic())
