"""What the core hands an executor: one call on some ranks (the contract: ``docs/executor-contract.md``)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from .._base import DispatchValueError


class Operation(enum.Enum):
    """The core's own work on a rank, run by ``WorkerHost`` instead of a worker method."""

    #: Read and free rows kept on the rank: the call's one argument is a ``RowAccess``.
    ROWS = "rows"
    #: One step of a weight transfer between groups (``_transfer.run_step``).
    TRANSFER = "transfer"
    #: After a replacement: replay setup on new ranks, then ``on_membership_change`` (``_worker.rejoin``).
    REJOIN = "rejoin"
    #: After a resize: renumber, replay setup on new ranks, the hook; or a probe (``_worker._resize``).
    RESIZE = "resize"
    #: The mesh query: the call's arguments are ``(role prefix, mesh name)``; the value ``(dp_rank, is_collect)``.
    MESH = "mesh"
    #: A replica's state handed to a replaced rank (``_worker._handover``): ``("version",)`` on the live
    #: replica, its ``weights_version``; ``("load", version)`` on the new rank, once every tensor arrived.
    HANDOVER = "handover"
    #: The sharded-state check after a failed call (``_worker._sharded``): ``("check",)`` reports this rank's
    #: FSDP2 state; ``("recover",)`` runs the worker's ``recover_sharded_state`` first.
    SHARDED = "sharded"


@dataclass(frozen=True)
class Instructions:
    """The core's orders to each rank of one call, beside the user's arguments (small and picklable)."""

    #: A traced call: the rank's value comes back as a ``TimedResult`` (timing out of band).
    timed: bool = False
    #: A lazy call: keep a ``DataProto`` result on the rank under this key (plus ``/<rank>``), send its description.
    keep_rows: str | None = None
    #: This call's id among the driver's calls (0: none), which a cancel names (``WorkerHost.cancel``).
    call_id: int = 0
    #: Keys of kept rows the driver let go of: freed on the rank before the call runs (unknown keys skipped).
    free: tuple[str, ...] = ()
    #: The core's own operation, run instead of a worker method (``None``: ``Call.method`` on the worker).
    operation: Operation | None = None


#: A call with no orders beyond running the method.
PLAIN = Instructions()

_new_instructions = object.__new__


def call_instructions(keep_rows: str | None, call_id: int) -> Instructions:
    """``Instructions(keep_rows=..., call_id=...)`` without the frozen dataclass's per-field setattr (hot path)."""
    made = _new_instructions(Instructions)
    made.__dict__.update(timed=False, keep_rows=keep_rows, call_id=call_id)
    return made


@dataclass
class Call:
    """One method call: ``ranks[i]`` runs ``method(*args[i], **kwargs[i])``."""

    method: str
    ranks: tuple[int, ...]
    args: list[tuple[Any, ...]]
    kwargs: list[dict[str, Any]]
    timeout: float | None = None
    #: The collect step copies every result anyway: an executor may skip isolating results.
    results_are_copied: bool = False
    #: What the core tells every rank of this call; forward it whole to ``WorkerHost.run``.
    instructions: Instructions = field(default=PLAIN)
    #: Run it on the rank's control path, beside any running call (see "Beside calls" in the contract).
    beside: bool = False

    def __post_init__(self) -> None:
        if len(self.ranks) != len(self.args) or len(self.args) != len(self.kwargs):
            raise DispatchValueError(
                f"Call {self.method!r}: {len(self.ranks)} ranks but {len(self.args)} "
                f"argument tuples and {len(self.kwargs)} keyword dicts"
            )

    def unique_values(self) -> UniqueValues:
        """Distinct argument objects (by identity) and per-rank slots into them."""
        values: list[Any] = []
        slots: dict[int, int] = {}

        def slot(obj: Any) -> int:
            key = id(obj)
            found = slots.get(key)
            if found is None:
                found = slots[key] = len(values)
                values.append(obj)
            return found

        arg_slots = [tuple(slot(a) for a in args) for args in self.args]
        kwarg_slots = [{k: slot(v) for k, v in kw.items()} for kw in self.kwargs]
        return UniqueValues(values, arg_slots, kwarg_slots)


@dataclass
class UniqueValues:
    """Argument objects deduplicated by identity, as :meth:`Call.unique_values`."""

    values: list[Any]
    arg_slots: list[tuple[int, ...]]
    kwarg_slots: list[dict[str, int]]

    def rebuild(self, position: int, resolved: list[Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """Arguments of the ``position``-th rank of the call from resolved values."""
        args = tuple(resolved[i] for i in self.arg_slots[position])
        kwargs = {k: resolved[i] for k, i in self.kwarg_slots[position].items()}
        return args, kwargs
