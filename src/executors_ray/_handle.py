"""Waiting for a call's results on Ray, always with a bound.

``ray.get`` is never called on a reference that is not ready.  The handle
waits with ``ray.wait(timeout=...)`` in short slices; a dead actor fails its
pending reference (``RayActorError``) and becomes :class:`WorkerDiedError`.
A rank still running after a slice is pinged in its actor's ``control``
concurrency group: a ping that fails, or goes unanswered for the group's
``death_timeout``, also means the rank is gone (a hung node, a lost process).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from dispatchcore import Call, CallHandle, RemoteFailure, WorkerDiedError
from dispatchcore._executor import timeout_error
from dispatchcore._worker_host import first_failure

from . import _payload
from ._actor import CONTROL_GROUP, FAILED, OK_PACKED

if TYPE_CHECKING:
    from ._executor import RayExecutor

_UNSET = object()


class RayCallHandle(CallHandle):
    """One submitted call: a result reference per rank of the call."""

    def __init__(self, executor: RayExecutor, call: Call, refs: list[Any]) -> None:
        self._executor = executor
        self._call = call
        self.refs = refs
        self._values: list[Any] = [_UNSET] * len(refs)
        self._failures: dict[int, RemoteFailure] = {}
        self._results: list[Any] | None = None
        self._pings: dict[int, tuple[Any, float]] = {}
        self._copy_results = executor.spec.isolate and not call.results_are_copied
        self._submitted = time.monotonic()
        self._ready: set[int] = set()

    @property
    def resolved(self) -> bool:
        """Whether the results were already fetched to the driver."""
        return self._results is not None

    @property
    def source_ray(self) -> Any:
        return self._executor.ray

    def done(self) -> bool:
        if self._results is not None:
            return True
        import ray

        pending = self._pending_refs()
        if not pending:
            return True
        ready, _ = ray.wait(pending, num_returns=len(pending), timeout=0, fetch_local=False)
        return len(ready) == len(pending)

    def _pending_refs(self) -> list[Any]:
        return [ref for pos, ref in enumerate(self.refs) if self._values[pos] is _UNSET]

    def result(self, timeout: float | None = None) -> list[Any]:
        if self._results is not None:
            return self._results
        if not self._ready and self._fast_get(timeout):
            return self._finish()
        self._wait_all(timeout, fetch=True)
        missing = [pos for pos, v in enumerate(self._values) if v is _UNSET]
        if missing:
            self._take(missing)
        return self._finish()

    def _fast_get(self, timeout: float | None) -> bool:
        """One bounded ``ray.get`` of every result: the common case in one round trip.

        Bounded by the poll interval, so liveness checks (``_wait_all``) cost
        nothing unless a call outlasts it.
        """
        executor = self._executor
        wait = executor.poll_interval if timeout is None else min(timeout, executor.poll_interval)
        try:
            values = executor.ray.get(self.refs, timeout=wait)
        except Exception:  # noqa: BLE001 - timed out, or a rank failed: the slow path says which
            return False
        self._values = list(values)
        return True

    def wait_ready(self, timeout: float | None = None) -> None:
        """Wait until every rank's result sits in the object store, fetching none of it."""
        if self._results is None:
            self._wait_all(timeout, fetch=False)

    def _wait_all(self, timeout: float | None, fetch: bool) -> None:
        """Return once every result is ready; bounded by ``timeout`` and liveness checks."""
        import ray

        deadline = None if timeout is None else time.monotonic() + timeout
        poll = self._executor.poll_interval
        while True:
            pending = [pos for pos, v in enumerate(self._values) if v is _UNSET and pos not in self._ready]
            if not pending:
                return
            wait = poll if deadline is None else max(0.0, min(poll, deadline - time.monotonic()))
            refs = [self.refs[pos] for pos in pending]
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=wait, fetch_local=fetch)
            if ready:
                got = set(ready)
                self._ready.update(pos for pos in pending if self.refs[pos] in got)
                continue
            if deadline is not None and time.monotonic() >= deadline:
                waiting = [self._call.ranks[p] for p in pending]
                self._maybe_break(waiting)
                raise timeout_error(self._call.method, timeout, waiting)
            self._check_alive(pending)

    def _maybe_break(self, waiting: list[int]) -> None:
        """A call past its own bound leaves its actors busy: refuse later calls.

        A shorter wait (``future.get(timeout=...)`` polling a call without a
        bound, or before its bound) leaves the group usable.
        """
        bound = self._call.timeout
        if bound is not None and time.monotonic() - self._submitted >= bound * 0.99:
            self._executor.mark_broken(
                f"call {self._call.method!r} outlived its {bound:g} s timeout and rank(s) {waiting} may still "
                "be running it"
            )

    def _take(self, positions: list[int]) -> None:
        """Fetch ready results (one ``ray.get``; per reference only if one failed)."""
        import ray

        refs = [self.refs[pos] for pos in positions]
        try:
            values = ray.get(refs)
        except Exception:  # noqa: BLE001 - find which rank it was
            values = []
            for pos, ref in zip(positions, refs, strict=True):
                try:
                    values.append(ray.get(ref))
                except Exception as exc:  # noqa: BLE001
                    raise self._died(pos, exc) from exc
        for pos, value in zip(positions, values, strict=True):
            self._values[pos] = value

    def _finish(self) -> list[Any]:
        results: list[Any] = []
        for pos, value in enumerate(self._values):
            if type(value) is not tuple:  # an atom, returned as it is
                results.append(value)
                continue
            status, payload = value
            if status == FAILED:
                self._failures[pos] = payload
                results.append(None)
            elif status == OK_PACKED:
                results.append(_payload.unpack(payload, copy=self._copy_results))
            else:
                results.append(payload)
        if self._failures:
            raise first_failure(self._failures, self._call.ranks)  # values stay set: asking again raises the same
        self._results = results
        return results

    def _died(self, position: int, exc: BaseException) -> WorkerDiedError:
        rank = self._call.ranks[position]
        name = self._executor.actor_name(rank)
        detail = f"its Ray actor {name!r} is gone ({type(exc).__name__}: {_first_line(exc)})"
        self._executor.mark_broken(f"rank {rank}'s actor {name!r} died")
        return WorkerDiedError(rank, detail, self._call.method)

    def _check_alive(self, pending: list[int]) -> None:
        """Ping ranks still running; raise if one is dead or silent past ``death_timeout``."""
        import ray

        now = time.monotonic()
        for pos in pending:
            ping = self._pings.get(pos)
            if ping is not None:
                ready, _ = ray.wait([ping[0]], timeout=0)
                if ready:
                    try:
                        ray.get(ready[0])
                    except Exception as exc:  # noqa: BLE001
                        raise self._died(pos, exc) from exc
                    ping = None
                elif now - ping[1] > self._executor.spec.death_timeout:
                    rank = self._call.ranks[pos]
                    self._executor.mark_broken(f"rank {rank} stopped answering")
                    raise WorkerDiedError(
                        rank,
                        f"its Ray actor {self._executor.actor_name(rank)!r} has not answered a liveness "
                        f"ping for {self._executor.spec.death_timeout:g} s (death_timeout)",
                        self._call.method,
                    )
            if ping is None:
                actor = self._executor.actor(self._call.ranks[pos])
                self._pings[pos] = (actor.ping.options(concurrency_group=CONTROL_GROUP).remote(), now)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else ""
