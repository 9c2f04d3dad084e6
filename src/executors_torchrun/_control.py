"""torchrun's directory for the core's lane: ranks read each group's lane address from the world's store.

Only processes that can read that store learn the lane's token.
"""

from __future__ import annotations

import torch.distributed as dist

from dispatchcore.executor import LaneAddress


class StoreDirectory:
    """A :class:`~dispatchcore.executor.LaneDirectory` on a c10d store (a lookup waits as ``store.get`` does)."""

    def __init__(self, store: dist.Store, key: str) -> None:
        self._store = store
        self._key = key

    def publish(self, address: LaneAddress) -> None:
        self._store.set(self._key, address.encode().encode())  # type: ignore[arg-type]  # the binding takes bytes

    def lookup(self) -> LaneAddress:
        return LaneAddress.decode(self._store.get(self._key))
