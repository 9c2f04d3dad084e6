"""Async RL, driver side: a rollout group streams versioned batches into training under a staleness policy.

Above ``_group`` and ``_sync``: it uses only a group's public calls (lazy,
non-blocking, on one-rank views) and ``WeightSync`` (``docs/async-rl.md``).
"""

from ._batch import Evicted, LostBatch, RolloutBatch, TakenStep
from ._policy import AheadBound, MaxStaleness, StalenessPolicy, StreamState
from ._stream import RolloutStream, StreamEnded
from ._version import NEWEST_KEY, VERSION_KEY, versioned, weights_version_of

__all__ = [
    "NEWEST_KEY",
    "VERSION_KEY",
    "AheadBound",
    "Evicted",
    "LostBatch",
    "MaxStaleness",
    "RolloutBatch",
    "RolloutStream",
    "StalenessPolicy",
    "StreamEnded",
    "StreamState",
    "TakenStep",
    "versioned",
    "weights_version_of",
]
