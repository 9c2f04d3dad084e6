"""The Ray actor behind one rank: the core's :class:`~dispatchcore.executor.LaneRank` plus what only Ray does.

Calls run on the ``lane`` concurrency group's one thread; other groups answer beside a running call.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from typing import Any

from dispatchcore import DispatchRuntimeError
from dispatchcore.executor import (
    LaneRank,
    ResultShape,
    StoreCollective,
    TensorBridge,
    WorkerHost,
    free_port,
    keep_freed_memory,
)

from . import _forward
from ._bulk import STASH_POLL_S, RankBulk, Shelf
from ._rows import RowFetcher, serve_rows
from ._runtime import cuda_device_index
from ._tags import (
    BESIDE_GROUP,
    BESIDE_THREADS,
    CONTROL_GROUP,
    HANDOVER_GROUP,
    HANDOVER_THREADS,
    LANE_GROUP,
    ROWS_GROUP,
    ROWS_THREADS,
    Raised,
)
from ._transfer import RayTensorLink, actor_bridge


class RankActor:
    """One rank of a group, hosted in a Ray actor process."""

    def __init__(self) -> None:
        self._rank = -1
        self._world_size = 0
        self._group = ""
        self._death_timeout = 60.0
        self._isolate = True
        #: The core's rank side (it holds the worker), made by the first driver's ``serve_lane``.
        self._lane: LaneRank | None = None
        self._bulk: RankBulk | None = None
        #: This process's tensor bridge for the first driver (weight transfers rank to rank).
        self._bridge: TensorBridge | None = None
        #: Stashed values and kept results of every lane this actor serves.
        self._shelf = Shelf()

    # -- start-up --------------------------------------------------------------
    def describe(self, want_port: bool = False) -> dict[str, Any]:
        """Where this actor lives, so the driver can lay out ranks and env."""
        import ray

        ctx = ray.get_runtime_context()
        return {
            "ip": str(ray.util.get_node_ip_address()),  # MASTER_ADDR when rank 0
            "node_id": ctx.get_node_id(),
            "pid": os.getpid(),
            "actor_id": ctx.get_actor_id(),
            "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
            "port": free_port("") if want_port else None,  # reachable from other nodes
        }

    def serve_lane(
        self,
        address: str,
        rank: int,
        env: Mapping[str, str] | None,
        group: str,
        death_timeout: float,
        inline_bytes: int,
        timeout: float,
        secret: bytes,
    ) -> None:
        """Serve the driver's lane at ``address`` on this thread (the ``lane`` group's) until it ends.

        ``secret``: the driver's lane secret, handed over by this Ray call (which Ray's authentication guards).

        The first driver sets ``env`` and makes the rank side; a later one (attaching) finds the worker as left.
        """
        if self._lane is None:
            os.environ.update(env or {})
            self._rank, self._group, self._death_timeout = rank, group, death_timeout
            self._bulk = RankBulk(rank, inline_bytes, self._shelf)
            gone = self._bulk.driver_gone.set
            self._lane = LaneRank(rank, prepare=self._prepare, bulk=self._bulk, on_driver_gone=gone)
        assert self._bulk is not None  # noqa: S101 - made with the lane
        self._bridge = actor_bridge(secret, address)  # the serving driver's (one that attached: its own secret)
        _serve(self._lane, self._bulk, address, timeout, secret)

    def serve_beside(self, address: str, rank: int, inline_bytes: int, timeout: float, secret: bytes) -> None:
        """Serve another group's lane (verl's ``worker_handles``), as its rank ``rank``, on a ``beside`` thread."""
        host = self._host()
        if host is None:
            raise DispatchRuntimeError("this actor hosts no started worker")
        self._select_device()  # this thread's current device, as the method thread's
        bulk = RankBulk(rank, inline_bytes, self._shelf)
        lane = LaneRank(rank, bulk=bulk, on_driver_gone=bulk.driver_gone.set)
        lane.host = host
        _serve(lane, bulk, address, timeout, secret)

    def _prepare(self, host: WorkerHost) -> None:
        """Before the worker's ``__init__``, on the method thread: device, row fetches, transfers, collective."""
        keep_freed_memory()  # this actor's process is the rank's own
        self._select_device()
        self._world_size, self._isolate = host.world_size, not host.share_kept_rows
        host.fetch_rows = RowFetcher(self._death_timeout)
        host.tensor_link = RayTensorLink(self._current_bridge, self._death_timeout)  # weight transfers rank to rank
        host.collective = StoreCollective.from_environment("ray", os.environ)  # the driver's store

    @staticmethod
    def _select_device() -> None:
        """Make this rank's GPU current on the calling thread (GPU actors only)."""
        import ray

        index = cuda_device_index(ray.get_gpu_ids(), os.environ.get("CUDA_VISIBLE_DEVICES"))
        if index is None:
            return
        import torch

        if torch.cuda.is_available():
            torch.cuda.set_device(index % max(1, torch.cuda.device_count()))

    def _current_bridge(self) -> TensorBridge:
        """The bridge of the driver serving this actor's lane now."""
        assert self._bridge is not None  # noqa: S101 - set before the lane is served
        return self._bridge

    def _host(self) -> WorkerHost | None:
        return None if self._lane is None else self._lane.host

    # -- the object store's side of the lane (rows group) --------------------------
    def stash(self, key: Any, as_is: bool, carried: Any, member: int | None = None) -> None:
        """A call value the lane's bulk path sent by the object store (``_bulk``)."""
        self._shelf.arrive(key, as_is, carried, member)

    def take_result(self, key: int) -> Any:
        """A result kept for the driver (large, or an object reference), handed over once."""
        return self._shelf.take_result(key)

    # -- verl's refs (handover group) -----------------------------------------------
    def hand_over(self, key: Any) -> Any:
        """A verl async call's outcome on this rank, once the driver stashed it (``verl._refs``)."""
        entry = self._shelf.entry(key)
        while not entry.arrived.wait(STASH_POLL_S):
            if self._bulk is None or self._bulk.driver_gone.is_set():
                break
        self._shelf.drop(key)
        if not entry.arrived.is_set():
            raise DispatchRuntimeError("the driver's lane closed before the call's outcome arrived")
        if isinstance(entry.value, Raised):
            raise entry.value.error
        return entry.value

    # -- control group (runs beside a busy call) --------------------------------
    def identity(self) -> dict[str, Any]:
        """Rank, world size and class of the hosted worker (for attaching by name)."""
        import ray

        host = self._host()
        return {
            "actor_id": ray.get_runtime_context().get_actor_id(),
            "rank": self._rank,
            "world_size": self._world_size,
            "group": self._group,
            "worker_cls": type(host.worker).__name__ if host is not None else "",
            "started": host is not None,
        }

    def describe_results(self, refs: list[Any], timeout: float) -> list[ResultShape | None]:
        """Row counts and ``meta_info`` of another call's results (for forwarding futures)."""
        return _forward.describe(refs, timeout)

    # -- rows group (serves kept rows beside a busy call) -------------------------
    def take_rows(self, requests: list[Any]) -> tuple[int, Any]:
        """Another rank's fetch of rows this process keeps: ``(OK_PACKED, payload)`` or ``(FAILED, message)``."""
        return serve_rows(self._rank, requests)


def _serve(lane: LaneRank, bulk: RankBulk, address: str, timeout: float, secret: bytes) -> None:
    """Serve ``lane`` until its driver ends it; stashed values waited for meanwhile fail once it has."""
    bulk.driver_gone.clear()
    try:
        lane.serve(address, timeout, secret=secret)
    finally:
        bulk.driver_gone.set()


@functools.cache
def actor_class() -> Any:
    """``ray.remote`` of ``RankActor`` with its concurrency groups (made once, on first use)."""
    import ray

    remote: Any = ray.remote  # its overloads do not list concurrency_groups
    groups = {
        LANE_GROUP: 1,
        BESIDE_GROUP: BESIDE_THREADS,
        CONTROL_GROUP: 1,
        ROWS_GROUP: ROWS_THREADS,
        HANDOVER_GROUP: HANDOVER_THREADS,
    }
    return remote(concurrency_groups=groups)(RankActor)
