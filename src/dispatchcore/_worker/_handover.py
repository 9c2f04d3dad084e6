"""Handing a rank's state to its replacement, rank side: the worker's hooks and the core's steps on the ranks.

A replaced rank replays setup, which rebuilds the state setup made, not
what training changed since.  A worker that says what its state is
(:meth:`StateHandover.replica_state`) gets it back from a live replica: the
driver half (:mod:`dispatchcore._group._heal`) moves those tensors rank to
rank with ``WeightSync``, which keeps them on the new rank's ``WorkerHost``
(no worker method receives them), then the core's ``Operation.HANDOVER``
hands them over whole (:func:`load_replica`).  No step is a method the
driver names.  See ``docs/replacing-ranks.md``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .._base import DispatchRuntimeError

if TYPE_CHECKING:
    import torch


def hands_over(worker_cls: type) -> bool:
    """Whether ``worker_cls`` defines a state hand-over and has replicas to take it from."""
    offer = getattr(worker_cls, "replica_state", None)
    return offer is not None and offer is not StateHandover.replica_state and worker_cls.replicas is not None  # type: ignore[attr-defined]


class StateHandover:
    """The state hand-over hooks of :class:`~dispatchcore.Worker` (override the first two)."""

    #: Which ranks hold the same state, so that a replaced rank can take it from a live one:
    #: ``"all"`` (data parallel, the default: every rank), the name of a mesh the worker declares
    #: (the ranks at the same place in each of its dp groups) or ``None`` (sharded: no rank holds
    #: another's state, as with FSDP2; restore those from a checkpoint).
    replicas: str | None = "all"

    def replica_state(self) -> Mapping[str, torch.Tensor] | None:
        """The named tensors a replacement of one of this rank's replicas must take; ``None``: no hand-over.

        Override it (with :meth:`load_replica_state`) to have a replaced rank
        take a survivor's trained state instead of the one setup left.  Values
        are CPU tensors (weights, optimizer moments), returned as they are.
        """
        return None

    def load_replica_state(self, state: dict[str, torch.Tensor]) -> None:
        """Take a live replica's :meth:`replica_state` (on a replaced rank, after setup replay)."""
        raise DispatchRuntimeError(
            f"{type(self).__name__} defines replica_state() but not load_replica_state(state): define both"
        )


def replica_version(worker: Any) -> Any:
    """The version a ``WeightSync`` last set on ``worker`` (``None``: none), which its replacement inherits."""
    return vars(worker).get("weights_version")


def load_replica(worker: Any, state: dict[str, torch.Tensor], version: Any) -> None:
    """Every tensor of the hand-over arrived: give ``worker`` the state, and the replica's ``weights_version``."""
    if version is None:
        vars(worker).pop("weights_version", None)
    else:
        vars(worker)["weights_version"] = version
    worker.load_replica_state(state)
