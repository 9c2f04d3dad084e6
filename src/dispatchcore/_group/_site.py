"""What one call needs to know about the group it goes through (the pipeline never reads a ``WorkerGroup``).

A group and its views share one :class:`SharedRanks`; each adds a :class:`CallSite`.  The core's own
calls (weight sync's steps, a rejoin, the mesh query, a hand-over, the row ledger's reads and frees)
are sent with :meth:`CallSite.submit`, the call pipeline's one submit path (``WorkerGroup.call_site``).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .._base import DispatchError
from .._rows import RowLedger
from .._spi import Call, Executor
from ._membership import Membership
from ._submit import Submitted, submit


@dataclass
class SharedRanks:
    """One executor's ranks, as every group and view over them sees them."""

    executor: Executor
    backend: str
    #: The root group's name in traces (``Actor#0``).
    label: str
    #: The group's ``lazy=`` default.
    lazy: bool
    on_rank_death: str
    ledger: RowLedger
    membership: Membership = field(default_factory=Membership)
    closed: bool = False
    #: The root group (a weak reference: the group owns this object), which replacement rebuilds.
    root: Callable[[], Any] | None = None
    #: Each method's signature binder by its name on the ranks, read on its first call (``_bind``).
    binders: dict[str, Any] = field(default_factory=dict)
    #: Handles of the calls sent, while anything holds them: a resize waits until each is done.
    calls: weakref.WeakSet[Any] = field(default_factory=weakref.WeakSet)
    #: A call ended early: the next call checks the ranks' sharded state first (``_sharded_check``).
    sharded_check_due: bool = False


@dataclass
class CallSite:
    """Where a group's calls go: ``ranks`` of the shared executor, methods named ``prefix + name``."""

    shared: SharedRanks
    ranks: tuple[int, ...]
    prefix: str
    call_timeout: float | None
    closed: bool = False
    #: Why this view takes no more calls (a shrink removed ranks it names), else ``None``.
    refused: str | None = None
    #: ``len(ranks)``, read on every call.
    world_size: int = field(init=False)

    def __post_init__(self) -> None:
        self.world_size = len(self.ranks)

    @property
    def executor(self) -> Executor:
        return self.shared.executor

    def submit(self, call: Call, group: Any = None, *, settled: bool = False) -> Submitted:
        """Send one of the core's own calls on these ranks through the call pipeline (``_submit``).

        ``group`` names the group in errors (``None``: the site's ranks); ``settled``: the caller
        settled the stragglers already.  Wait with ``result(timeout)``.
        """
        return submit(group, self, call, settled=settled)

    def over(self, ranks: tuple[int, ...] | None = None, prefix: str | None = None) -> CallSite:
        """A site for a view: some of these ranks, or another role's prefix."""
        return CallSite(
            self.shared,
            self.ranks if ranks is None else ranks,
            self.prefix if prefix is None else prefix,
            self.call_timeout,
        )

    def check_open(self, group: Any) -> None:
        """Raise :class:`DispatchError` when the group (or its root) is shut down or its executor broken."""
        if self.shared.closed or self.closed:  # a view shut down refuses calls; its parent goes on
            raise DispatchError(f"{group!r} is shut down; create a new WorkerGroup")
        if self.refused is not None:
            raise DispatchError(f"{group!r} can take no more calls: {self.refused}")
        reason = self.shared.executor.broken
        if not reason:
            return
        fix = "Shut it down and create a new one"
        if self.shared.executor.can_replace_ranks():
            dead = self.shared.ledger.dead  # root ranks; a view's replace_rank takes its own positions
            lost = ", ".join(str(self.ranks.index(r)) for r in sorted(dead) if r in self.ranks) or "<rank>"
            fix = f"Restart the lost rank(s) with wg.replace_rank({lost}) (setup is replayed), or {fix.lower()}"
        raise DispatchError(f"{group!r} can take no more calls: {reason}. {fix}")


def ledger_sender(shared: SharedRanks) -> Callable[[Call], Submitted]:
    """What the row ledger sends its beside calls with (holding the ranks weakly: rows never keep a group alive)."""
    ref = weakref.ref(shared)

    def send(call: Call) -> Submitted:
        found = ref()
        if found is None:
            raise DispatchError("the group holding these lazy rows was shut down; its rows are gone")
        return CallSite(found, call.ranks, "", None).submit(call)

    return send
