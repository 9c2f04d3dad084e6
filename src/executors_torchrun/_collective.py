"""``dispatchcore.collective`` on torchrun ranks: gloo groups on a prefix of the world's own store.

Every process of a world already reaches its c10d store (torchrun's agent
store, or the self-started world's), so each rank of a group gets a
:class:`~dispatchcore.executor.StoreCollective` on ``collective/<group id>/``
of it; the group is built on first use, per replacement generation, and
never touches the default group or ``MASTER_*``.
"""

from __future__ import annotations

import torch.distributed as dist

from dispatchcore.executor import StoreCollective

#: The backend's name, as ``dispatchcore.collective.rank_info()`` reports it.
BACKEND = "torchrun"


def collective_link(store: dist.Store, gid: str) -> StoreCollective:
    """The link for one rank of group ``gid``."""
    return StoreCollective(BACKEND, store=dist.PrefixStore(f"collective/{gid}/", store))
