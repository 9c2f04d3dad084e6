"""Weight transfers between Ray groups: rank to rank over the core's tensor bridge, or a small bucket inline.

A bucket's tensors go from the source actor's process straight into the
destination's places (gloo point to point for CPU tensors, NCCL for CUDA
ones), never through the object store or the driver: the object store
stays for other large values and users' refs.  See docs/weight-sync.md.
"""

from __future__ import annotations

import functools
import threading
import warnings
from collections.abc import Callable
from typing import Any

import torch

from dispatchcore.executor import LOOPBACK, LaneAddress, TensorBridge, TensorBridgeLink

#: Buckets up to this many bytes ride the control lane through the driver, in the steps' own messages: for
#: them a bridge's request and its posted operations cost more than the bytes (a 0.34 MB set).
INLINE_BYTES = 1 << 20

_bridges: dict[tuple[bytes, str], TensorBridge] = {}
_bridges_lock = threading.Lock()


class _Inline(list[Any]):
    """A bucket's arrays carried as the token itself."""


def actor_bridge(secret: bytes, lane: str) -> TensorBridge:
    """This actor process's bridge for the driver whose lane is at ``lane`` (made once per driver secret).

    Its door and own store listen on loopback when the lane does (every actor on the driver's node), else on
    the address Ray knows this node by.
    """
    host = LOOPBACK if LaneAddress.decode(lane).host == LOOPBACK else _node_address()
    with _bridges_lock:
        bridge = _bridges.get((secret, host))
        if bridge is None:
            bridge = _bridges[(secret, host)] = TensorBridge(secret, host=host)
        return bridge


@functools.cache
def _node_address() -> str:
    import ray

    return str(ray.util.get_node_ip_address())


class RayTensorLink:
    """The :class:`~dispatchcore.executor.TensorLink` of a Ray actor: its process's bridge, small buckets inline."""

    same_process = False

    def __init__(self, bridge: Callable[[], TensorBridge], death_timeout: float) -> None:
        """``bridge``: the process's bridge for the driver serving the actor now (an attached one has its own)."""
        self._bridge = bridge
        self._timeout = death_timeout

    def publish(self, tensors: list[torch.Tensor], readers: int) -> Any:
        if not any(t.is_cuda for t in tensors) and sum(t.nbytes for t in tensors) <= INLINE_BYTES:
            return _Inline(t.reshape(-1).view(torch.uint8).numpy() for t in tensors)
        return TensorBridgeLink(self._bridge(), self._timeout).publish(tensors, readers)

    def receive(self, token: Any, into: list[torch.Tensor | None]) -> Callable[[], tuple[list[torch.Tensor], bool]]:
        """An inline bucket copied into its places (the rest: the message's memory), else the bridge's receive."""
        if not isinstance(token, _Inline):
            return TensorBridgeLink(self._bridge(), self._timeout).receive(token, into)
        got = []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the message's read-only memory: only read here, or handed on as shared
            for a, target in zip(token, into, strict=True):
                x = torch.from_numpy(a)
                if target is not None:
                    target.reshape(-1).view(torch.uint8).copy_(x)
                got.append(x if target is None else target)
        return lambda: (got, True)
