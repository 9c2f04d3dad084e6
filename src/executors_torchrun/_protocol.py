"""What a world's store holds: torch's rendezvous, plain addresses and plain flags, never a pickle.

The library's own messages travel on the driver's authenticated links
(``_post``, ``_hub``); a stranger who reaches a store can delete or set these
keys (a denial of service), never run code through them::

    ready                          counter: processes up (the driver waits for the count)
    hub                            "host port": the driver's hub, under the launcher
    transport/<generation>/<rank>  "" once that process joined the row transport's generation, else why not
    stopped/<rank>                 "host pid", set by a process as it leaves (the driver waits for its end)
    gloo/..., nccl-rows/..., rowbridge/..., dispatchcore-bridge/..., collective/...
                                   torch's own rendezvous of the library's groups
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

#: Blocking waits on a store use this timeout: nothing times out on purpose (a store-side
#: timeout leaves the client socket out of step).
FOREVER_S = 365 * 24 * 3600
READY_KEY = "ready"
HUB_KEY = "hub"


def stopped_key(rank: int) -> str:
    return f"stopped/{rank}"


def transport_key(generation: int, rank: int) -> str:
    return f"transport/{generation}/{rank}"


def home_of(store: dist.Store) -> tuple[str, int]:
    """``(host, port)`` of the ``TCPStore`` under ``store`` (its world's, when compared)."""
    raw: Any = store._underlying_non_prefix_store if isinstance(store, dist.PrefixStore) else store  # type: ignore[attr-defined]
    return str(raw.host), int(raw.port)
