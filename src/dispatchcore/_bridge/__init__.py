"""Tensors rank to rank between the processes of a driver's groups (weight sync on every process backend).

Imports ``_base``, ``_lane``, ``_spi``, ``_transfer``, ``_wire`` and ``_worker``; executors reach it through
``dispatchcore.executor``.
"""

from ._bridge import TensorBridge, TensorBridgeLink, Token
from ._pairs import SendReaper, gloo_group, nccl_group, pair_group, peer_error

__all__ = [
    "SendReaper",
    "TensorBridge",
    "TensorBridgeLink",
    "Token",
    "gloo_group",
    "nccl_group",
    "pair_group",
    "peer_error",
]
