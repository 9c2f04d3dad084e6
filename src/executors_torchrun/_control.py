"""torchrun's directory for the core's lane: the world's store is where ranks read each group's lane address.

The lane itself (the door, its token, the links, both sides of a call) is
the core's (:mod:`dispatchcore.executor`); this module only fills its
:class:`~dispatchcore.executor.LaneDirectory` with the c10d store every
process of the world already reaches, so only processes that can read that
store learn the token.
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
