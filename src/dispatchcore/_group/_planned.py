"""A planned call: the ``Call`` to submit and what its collect needs to know (so stages need not import each other)."""

from __future__ import annotations

from dataclasses import dataclass

from .._dispatch import CallContext, DispatchSpec
from .._rows import RemoteRows
from .._spi import Call


@dataclass(slots=True)
class PlannedCall:
    """A call ready to submit, and what its collect needs to know."""

    call: Call
    spec: DispatchSpec
    #: The collect plan the dispatch filled in (positions, padding).
    context: CallContext
    #: Lazy: results stay on the ranks and come back as ``LazyDataProto``.
    lazy: bool
    #: ``Execute.RANK_ZERO``: the caller gets rank 0's value itself.
    unwrap: bool
    #: Rows the call's lazy arguments read; kept alive until the call is over.
    read_sources: list[RemoteRows]
    #: The group's replacement generation when the call began (retry after a replacement).
    generation: int
