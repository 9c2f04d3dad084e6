"""``dispatchcore.collective`` on torchrun ranks: a :class:`~dispatchcore.executor.StoreCollective` on the world store.

Every process of a world already reaches that store; the group lives under
``collective/<group id>/`` and never touches the default group or ``MASTER_*``.
"""

from __future__ import annotations

import torch.distributed as dist

from dispatchcore.executor import StoreCollective

#: The backend's name, as ``dispatchcore.collective.rank_info()`` reports it.
BACKEND = "torchrun"


def collective_link(store: dist.Store, gid: str) -> StoreCollective:
    """The link for one rank of group ``gid``."""
    return StoreCollective(BACKEND, store=dist.PrefixStore(f"collective/{gid}/", store))
