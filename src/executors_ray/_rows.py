"""Lazy results' rows moved actor to actor, never through the driver (docs/lazy-results.md)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dispatchcore import DataProto, DispatchError, WorkerDiedError
from dispatchcore.executor import RowRequest, take_kept_rows

from ._rank_actors import first_line
from ._store import pack_value, unpack
from ._tags import FAILED, OK_PACKED, ROWS_GROUP

#: Bound on pulling answered rows, which are ready by then: it only guards a node lost in between.
PULL_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class RowAddress:
    """Where a rank's kept rows live: its actor (id, name, handle), in which Ray connection (job and driver node)."""

    ray: str
    #: Ray's id of the actor: groups requests by producer (a replaced rank's new actor has a new one).
    actor_id: str
    name: str
    actor: Any


def serve_rows(rank: int, requests: Sequence[RowRequest]) -> tuple[int, Any]:
    """Producing actor: ``(OK_PACKED, payload)`` of one DataProto per request, or ``(FAILED, message)``."""
    try:
        parts = [take_kept_rows(request) for request in requests]
        return OK_PACKED, pack_value(parts)
    except Exception as exc:  # noqa: BLE001 - the consumer raises it with its context
        return FAILED, f"rank {rank} could not serve its kept rows: {type(exc).__name__}: {exc}"


class RowFetcher:
    """Consuming actor's ``WorkerHost.fetch_rows``: rows of other actors, fetched in parallel, bounded by death."""

    def __init__(self, death_timeout: float) -> None:
        self.death_timeout = death_timeout

    def __call__(self, requests: Sequence[RowRequest]) -> list[DataProto]:
        import ray

        by_actor: dict[str, list[int]] = {}
        for i, request in enumerate(requests):
            address = request.address
            if not isinstance(address, RowAddress):
                raise DispatchError(
                    f"rows of rank {request.rank} are kept at {address!r}, which a Ray actor cannot reach "
                    "(the driver should have sent them; please report this)"
                )
            by_actor.setdefault(address.actor_id, []).append(i)
        refs = {}
        for actor_id, positions in by_actor.items():
            task = requests[positions[0]].address.actor.take_rows.options(concurrency_group=ROWS_GROUP)
            refs[actor_id] = task.remote([requests[i] for i in positions])
        # Answered (or failed: a dead actor's task fails at once) without pulling the rows yet.
        ray.wait(list(refs.values()), num_returns=len(refs), timeout=self.death_timeout, fetch_local=False)
        out: list[DataProto | None] = [None] * len(requests)
        for actor_id, positions in by_actor.items():
            for i, part in zip(positions, self._pull(ray, refs[actor_id], requests[positions[0]]), strict=True):
                out[i] = part
        return [part for part in out if part is not None]

    def _pull(self, ray: Any, ref: Any, request: RowRequest) -> list[DataProto]:
        """One producer's answer, unpacked over the object store's memory (no copy)."""
        address: RowAddress = request.address
        ready, _ = ray.wait([ref], timeout=0, fetch_local=False)
        if not ready:
            raise WorkerDiedError(
                request.rank,
                f"its Ray actor {address.name!r} did not answer a request for the rows it keeps within "
                f"{self.death_timeout:g} s (death_timeout)",
            )
        try:
            tag, payload = ray.get(ref, timeout=PULL_TIMEOUT_S)
        except ray.exceptions.RayTaskError as exc:  # take_rows itself failed (it reports, so hardly ever)
            raise DispatchError(f"rank {request.rank} could not serve its kept rows: {exc}") from exc
        except Exception as exc:  # noqa: BLE001 - actor or node gone, rows lost, pull timed out
            raise WorkerDiedError(
                request.rank, f"its Ray actor {address.name!r} is gone ({type(exc).__name__}: {first_line(exc)})"
            ) from exc
        if tag == FAILED:
            raise DispatchError(payload)
        parts: list[DataProto] = unpack(payload, copy=False)
        return parts
