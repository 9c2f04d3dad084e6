"""One rank's kept result as the driver knows it: a handle whose last reference frees the rows."""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any, Protocol

from ._records import HeldRows, RowRequest


class Releases(Protocol):
    """Who frees a handle's rows once nothing refers to it (the ledger that made it)."""

    def release(self, rank: int, key: str, nbytes: int) -> None: ...


class RemoteRows:
    """One rank's kept result, as the driver knows it: where, how big, which columns."""

    __slots__ = ("__weakref__", "address", "held", "ledger", "rank")

    def __init__(self, ledger: Releases, rank: int, address: Any, held: HeldRows) -> None:
        self.ledger = ledger
        self.rank = rank
        self.address = address
        self.held = held
        weakref.finalize(self, ledger.release, rank, held.key, held.nbytes)

    def request(self, columns: Sequence[str], index: Any) -> RowRequest:
        return RowRequest(self.address, self.rank, self.held.key, tuple(columns), index)

    def __repr__(self) -> str:
        return f"RemoteRows(rank={self.rank}, rows={self.held.rows}, key={self.held.key!r})"
