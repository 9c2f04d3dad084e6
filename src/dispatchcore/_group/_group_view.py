"""Which ranks a sub-group view calls: ``wg[0:2]``, ``wg[3]``, ``wg.ranks([0, 3])``, refusing what cannot be meant."""

from __future__ import annotations

import operator
from collections.abc import Iterable
from typing import Any

from .._base import DispatchIndexError, DispatchTypeError, DispatchValueError


def select_by_index(ranks: tuple[int, ...], index: Any) -> tuple[int, ...]:
    """``wg[index]``: an int or a slice, read as on a sequence of the group's ranks."""
    n = len(ranks)
    if isinstance(index, slice):
        chosen = ranks[index]
        if not chosen:
            raise DispatchValueError(
                f"wg[{_show_slice(index)}] selects no rank of a group of {n}; a view needs at least one rank"
            )
        return chosen
    if isinstance(index, bool) or not _is_int(index):
        raise DispatchTypeError(
            f"a WorkerGroup is indexed by a rank number or a slice (wg[1], wg[0:2]), got {type(index).__name__}; "
            "use wg.ranks([...]) for a list of ranks"
        )
    position = operator.index(index)
    if not -n <= position < n:
        raise DispatchIndexError(
            f"wg[{position}]: rank {position} is out of range for a group of {n} ranks (0..{n - 1})"
        )
    return (ranks[position],)


def select_ranks(ranks: tuple[int, ...], selection: Iterable[int]) -> tuple[int, ...]:
    """``wg.ranks(selection)``: distinct rank numbers of this group, in the order given."""
    n = len(ranks)
    if isinstance(selection, (str, bytes)) or not isinstance(selection, Iterable):
        raise DispatchTypeError(f"wg.ranks(...) takes a list of rank numbers, e.g. wg.ranks([0, 3]); got {selection!r}")
    wanted = list(selection)
    if not wanted:
        raise DispatchValueError("wg.ranks([]) selects no rank; a view needs at least one rank")
    bad = [r for r in wanted if isinstance(r, bool) or not _is_int(r)]
    if bad:
        raise DispatchTypeError(f"wg.ranks({wanted!r}): rank numbers must be ints, got {bad!r}")
    positions = [operator.index(r) for r in wanted]
    outside = [r for r in positions if not 0 <= r < n]
    if outside:
        raise DispatchIndexError(
            f"wg.ranks({positions}): rank(s) {outside} out of range for a group of {n} ranks (0..{n - 1})"
        )
    repeated = sorted({r for r in positions if positions.count(r) > 1})
    if repeated:
        raise DispatchValueError(f"wg.ranks({positions}): rank(s) {repeated} named more than once; name each rank once")
    return tuple(ranks[r] for r in positions)


def _is_int(value: Any) -> bool:
    try:
        operator.index(value)
    except TypeError:
        return False
    return True


def _show_slice(index: slice) -> str:
    parts = ["" if v is None else str(v) for v in (index.start, index.stop, index.step)]
    return ":".join(parts if index.step is not None else parts[:2])
