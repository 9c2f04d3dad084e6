"""torchrun's side of the control lane: the world's store is the directory ranks read the lane's address from.

The lane itself (links, the door, the token handshake) is the shared part in
:mod:`dispatchcore.executor`; this module only fills its
:class:`~dispatchcore.executor.LaneDirectory` with the c10d store every rank
of the world already reaches, so only processes that can read that store
learn the token.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch.distributed as dist

from dispatchcore.executor import LaneAddress, LaneLink, connect_lane, open_lane

#: Store key under which the hub publishes the lane's address and token.
CONTROL_KEY = "control"


class StoreDirectory:
    """A :class:`~dispatchcore.executor.LaneDirectory` on a c10d store (a lookup waits as ``store.get`` does)."""

    def __init__(self, store: dist.Store, key: str = CONTROL_KEY) -> None:
        self._store = store
        self._key = key

    def publish(self, address: LaneAddress) -> None:
        self._store.set(self._key, address.encode().encode())  # type: ignore[arg-type]  # the binding takes bytes

    def lookup(self) -> LaneAddress:
        return LaneAddress.decode(self._store.get(self._key))


def accept_ranks(
    store: dist.Store,
    ranks: Iterable[int],
    host: str,
    timeout: float,
    gone: Callable[[int], str | None] = lambda rank: None,
) -> dict[int, LaneLink]:
    """On the hub: publish the lane in the store, take one link from each of ``ranks``, stop listening."""
    with open_lane(host) as door:
        StoreDirectory(store).publish(door.address)
        return door.accept(ranks, timeout, gone)


def connect_to_hub(store: dist.Store, rank: int, timeout: float = 60.0) -> LaneLink:
    """On a rank: read the lane's address from the store and connect as ``rank``."""
    return connect_lane(StoreDirectory(store).lookup(), rank, timeout)
