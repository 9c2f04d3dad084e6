"""Handing a rank's state to its replacement, rank side: the worker's hooks and the core's steps on the ranks.

A replaced rank replays setup, which rebuilds the state setup made, not
what training changed since.  A worker that says what its state is
(:meth:`StateHandover.replica_state`) gets it back from a live replica: the
driver half (:mod:`dispatchcore._group._heal`) moves those tensors rank to
rank with ``WeightSync`` into :meth:`~StateHandover._dispatchcore_replica_part`,
then :meth:`~StateHandover._dispatchcore_replica_load` hands them over whole.
See ``docs/replacing-ranks.md``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from .._base import DispatchRuntimeError

if TYPE_CHECKING:
    import torch

#: Where the tensors of a hand-over wait on the new rank until the last bucket arrived.
_PARTS = "_dispatchcore_replica_parts"


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

    def _dispatchcore_replica_part(self, tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """One bucket of the hand-over (``WeightSync``'s apply step): kept until all arrived."""
        self.__dict__.setdefault(_PARTS, {}).update(tensors)

    def _dispatchcore_replica_load(self, version: Any) -> None:
        """Every bucket arrived: hand the state over, and take the replica's ``weights_version``."""
        state = self.__dict__.pop(_PARTS, {})
        if version is None:
            self.__dict__.pop("weights_version", None)
        else:
            self.__dict__["weights_version"] = version
        self.load_replica_state(state)

    def _dispatchcore_weights_version(self) -> Any:
        """The version a ``WeightSync`` last set here (``None``: none), which the replacement inherits."""
        return self.__dict__.get("weights_version")
