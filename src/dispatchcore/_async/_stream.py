"""``RolloutStream``: a rollout group generating continuously into a bounded, versioned queue the trainer takes from.

The driver keeps one generate call in flight on every rollout rank (a call
on a one-rank view, lazy and non-blocking), so a slow generation holds up
only its own rank.  A background thread (the *pump*) starts calls as the
policy admits them, collects finished ones (rows stay on the rank: the
driver holds a ``LazyDataProto``), applies new weights to each rank at its
next call boundary, and requeues the prompts of lost batches.  ``take``
hands the trainer batches chosen by the policy as one lazy ``DataProto``;
the trainer's ranks fetch the rows from the rollout ranks.
"""

from __future__ import annotations

import collections
import contextvars
import dataclasses
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from .._base import (
    CallCancelledError,
    DispatchRuntimeError,
    DispatchTimeoutError,
    DispatchTypeError,
    DispatchValueError,
    WorkerDiedError,
    WorkerError,
)
from .._data import DataProto
from .._sync import WeightSync
from .._trace import active_tracer, now_us
from ._batch import Evicted, LostBatch, RolloutBatch, TakenStep
from ._policy import StalenessPolicy, StreamState
from ._prompts import prompt_batches
from ._resize import grow_stream, shrink_stream
from ._version import NEWEST_KEY, VERSION_KEY

_POLL = 0.005
#: Errors of the call itself (a raise, a death, a cancel); any other while the group cannot take calls is a refusal.
_OWN_ERRORS = (WorkerError, WorkerDiedError, CallCancelledError)


class StreamEnded(DispatchRuntimeError):
    """The stream has no more batches to give: its prompts ran out, or it was closed."""


@dataclass
class _Slot:
    """One rollout rank as the pump sees it: what it runs now and the weights it holds."""

    rank: int
    proxy: Any
    version: int
    busy: str = ""  # "", "generate" or "sync"
    batch: RolloutBatch | None = None
    future: Any = None
    sync_version: int | None = None
    retired: BaseException | None = None
    last_stamp: int | None = None
    #: A rank new to the stream (grown, or replaced after a death): synced from ``weights_from`` before it generates.
    fresh: bool = False


class RolloutStream:
    """Batches from ``generate`` (a rollout group's lazy-capable method) for the trainer, bounded by ``policy``.

    ``prompts`` is a ``DataProto`` cut into ``batch_size`` rows per call (and
    cycled), an iterable of ``DataProto`` batches, or a callable returning
    one.  The method must be ``@versioned`` (it stamps each batch with the
    rank's weight version).  With ``weights_from`` (the trainer group, or a
    stage group holding a snapshot), :meth:`publish` updates each rollout rank
    by its own ``WeightSync`` at its next call boundary; ``snapshot`` (a
    ``WeightSync`` from the trainer into that stage) runs first, at the step
    boundary.  See ``docs/async-rl.md``.
    """

    def __init__(
        self,
        generate: Any,
        prompts: Any,
        *,
        batch_size: int | None = None,
        policy: StalenessPolicy | None = None,
        batches_per_step: int = 1,
        initial_version: int = 0,
        weights_from: Any = None,
        snapshot: WeightSync | None = None,
        sync_options: dict[str, Any] | None = None,
        max_attempts: int = 3,
        interrupt: bool = False,
    ) -> None:
        group, name = _method_of(generate)
        if isinstance(batches_per_step, bool) or not isinstance(batches_per_step, int) or batches_per_step < 1:
            raise DispatchValueError(f"batches_per_step must be an int >= 1, got {batches_per_step!r}")
        if policy is not None and not isinstance(policy, StalenessPolicy):
            raise DispatchTypeError(
                f"policy must be a StalenessPolicy (MaxStaleness(k), AheadBound(n) or your subclass), got {policy!r}"
            )
        if snapshot is not None and weights_from is None:
            raise DispatchValueError("snapshot= needs weights_from= (the stage group the snapshot lands in)")
        self.group, self.method = group, name
        self.policy = policy if policy is not None else StalenessPolicy()
        self.batches_per_step = batches_per_step
        self.initial_version = self.trainer_version = int(initial_version)
        self.weights_from, self.snapshot = weights_from, snapshot
        self._sync_options = dict(sync_options or {})
        self.max_attempts = int(max_attempts)
        #: Cancel, at ``publish``, running generate calls whose batch the policy would evict at the new version.
        self.interrupt = bool(interrupt)
        #: Batches cancelled by ``interrupt`` (their prompts regenerated, no attempt counted), by ``seq``.
        self.interrupted: list[int] = []
        self._prompts = prompt_batches(prompts, batch_size)
        self._requeued: collections.deque[tuple[Any, int]] = collections.deque()
        self._exhausted = False
        self._slots = [self._slot(r) for r in range(group.world_size)]
        self._syncs: dict[int, WeightSync] = {}
        self._ready: list[RolloutBatch] = []
        self._consumed = 0
        self._seq = 0
        self._target: int | None = None
        self._fatal: BaseException | None = None
        #: Lost batches (a rank raised, died, or the call was cancelled), each requeued or given up on.
        self.lost: list[LostBatch] = []
        #: Finished batches a policy threw away at take time.
        self.evicted: list[Evicted] = []
        #: Every batch handed to the trainer, in order (without its rows: the trainer's step holds those).
        self.consumed: list[RolloutBatch] = []
        self._cond = threading.Condition()
        self._closing = self._closed = False
        self._drop = False
        #: Held by a resize (``_resize``): the pump starts nothing until it is over.
        self._held = False
        context = contextvars.copy_context()  # a trace block open here records the stream's calls too
        self._pump = threading.Thread(target=context.run, args=(self._run,), name="dispatchcore-rollout", daemon=True)
        self._pump.start()

    def _slot(self, rank: int, version: int | None = None) -> _Slot:
        proxy = getattr(self.group.ranks([rank]), self.method).options(lazy=True, blocking=False)
        return _Slot(rank, proxy, self.initial_version if version is None else version)

    # -- the rollout group changing size while the stream runs (``_resize``) ----------
    def grow(self, count: int, **options: Any) -> Any:
        """``rollout.grow(count, **options)`` while the stream runs; the new ranks generate once they hold the
        trainer's version (synced from ``weights_from``; without it, give ``grow`` the weights: ``sync=``,
        ``version=``).  Returns the group's ``GroupResized``."""
        return grow_stream(self, count, options)

    def shrink(self, *ranks: int) -> Any:
        """``rollout.shrink(*ranks)`` while the stream runs: the batches waiting on ranks that go or are
        renumbered are regenerated elsewhere (in ``stream.lost``, regenerated).  Returns ``GroupResized``."""
        return shrink_stream(self, ranks)

    # -- the trainer's side --------------------------------------------------------
    def take(self, n: int | None = None, *, timeout: float | None = None) -> TakenStep:
        """``n`` batches (default ``batches_per_step``) chosen by the policy, as one lazy ``DataProto``.

        Waits for them; past ``timeout`` raises ``DispatchTimeoutError``.
        Raises :class:`StreamEnded` when no batch can come any more, and the
        error of a batch that failed ``max_attempts`` times.
        """
        want = self.batches_per_step if n is None else int(n)
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            chosen = self._choose(want, deadline, timeout)
            for batch in chosen:
                self._ready.remove(batch)
            self._consumed += len(chosen)
            self.consumed.extend(dataclasses.replace(b, data=None, prompts=None) for b in chosen)  # no rows held
            self._cond.notify_all()
            version = self.trainer_version
        data = DataProto.concat([b.data for b in chosen]) if len(chosen) > 1 else chosen[0].data
        return TakenStep(chosen, data, version, [b.staleness(version) for b in chosen])

    def _choose(self, want: int, deadline: float | None, timeout: float | None) -> list[RolloutBatch]:
        while True:
            if self._fatal is not None:
                raise self._fatal
            self._evict_stale()
            state = self._state(self.trainer_version)
            chosen = self.policy.select(list(self._ready), want, state)
            generating = sum(1 for s in self._slots if s.busy == "generate")
            if len(chosen) >= want:
                return list(chosen[:want])
            if self._closed or (self._exhausted and not self._requeued and generating == 0):
                if chosen:
                    return list(chosen)
                raise StreamEnded(f"the rollout stream of {self.method!r} has no more batches ({self._why_ended()})")
            self._check_stuck(generating + len(self._ready))
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise DispatchTimeoutError(
                    f"take({want}) got {len(chosen)} batch(es) within {timeout:g} s: {self.describe()}"
                )
            self._cond.wait(0.05 if left is None else min(0.05, left))

    def _why_ended(self) -> str:
        return "it was closed" if self._closed else "its prompts ran out"

    def _check_stuck(self, live: int) -> None:
        """Nothing generating or ready and the policy admits nothing: only a ``publish`` can help, so say so."""
        if live or self._closing:
            return
        working = [s for s in self._slots if s.retired is None]
        if not working:
            self.group.ensure_usable()  # a broken group's own error says why and what to do
            raise DispatchRuntimeError(f"every rollout rank of {self.method!r} is out: {self.describe()}")
        if any(s.busy for s in working) or self._admissible():
            return
        if self._target is not None and any(s.version < self._target for s in working):
            return
        raise DispatchRuntimeError(
            f"the policy {self.policy!r} admits no batch until the trainer moves past version "
            f"{self.trainer_version}: call stream.publish(version) after each training step ({self.describe()})"
        )

    def _admissible(self) -> bool:
        working = [s for s in self._slots if s.retired is None]
        return any(self.policy.admit(self._state(self.trainer_version, s.version)) for s in working)

    def publish(self, version: int) -> None:
        """The trainer is at ``version`` now: ranks take these weights at their next call boundary.

        With ``snapshot=`` it first copies the trainer's weights into the stage
        (blocking: the trainer is between steps); each rank's own ``WeightSync``
        from ``weights_from`` then runs as soon as that rank is between
        generate calls, while the trainer trains.  Without ``weights_from`` the
        caller updates the rollout ranks itself (a colocated role, say).
        """
        version = int(version)
        if version < self.trainer_version:
            raise DispatchValueError(f"publish({version}): the trainer is at version {self.trainer_version} already")
        if self.snapshot is not None:
            self.snapshot(version)
        with self._cond:
            self.trainer_version = version
            if self.weights_from is not None:
                self._target = version
            else:  # the caller updates the ranks itself, before their next call
                for slot in self._slots:
                    slot.version = max(slot.version, version)
                self._target = None
            doomed = self._doomed() if self.interrupt else []
            self._cond.notify_all()
        for future in doomed:  # outside the lock: the pump collects each as a cancelled batch, requeued
            future.cancel()

    def _doomed(self) -> list[Any]:
        """Under the lock: running generate calls whose batch could no longer be taken (the policy evicts it)."""
        state = self._state(self.trainer_version)
        doomed = []
        for slot in self._slots:
            batch = slot.batch
            if (
                slot.busy == "generate"
                and batch is not None
                and slot.future is not None
                and self.policy.evict(batch, state)
            ):
                self.interrupted.append(batch.seq)
                doomed.append(slot.future)
        return doomed

    def wait_synced(self, timeout: float | None = None) -> None:
        """Wait until every working rank holds the last published version (raises ``DispatchTimeoutError``)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while any(s.retired is None and s.version < self.trainer_version for s in self._slots):
                if self._fatal is not None:
                    raise self._fatal
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise DispatchTimeoutError(
                        f"rollout ranks not at version {self.trainer_version}: {self.describe()}"
                    )
                self._cond.wait(0.05 if left is None else min(0.05, left))

    # -- state ---------------------------------------------------------------------
    def _state(self, trainer_version: int, rollout_version: int | None = None) -> StreamState:
        generating = [s.batch.seq for s in self._slots if s.busy == "generate" and s.batch is not None]
        return StreamState(
            consumed=self._consumed,
            live=len(generating) + len(self._ready),
            trainer_version=trainer_version,
            rollout_version=min(s.version for s in self._slots) if rollout_version is None else rollout_version,
            initial_version=self.initial_version,
            batches_per_step=self.batches_per_step,
            first_generating=min(generating) if generating else None,
        )

    def describe(self) -> str:
        """One line: versions, what each rank does, how many batches wait, were lost or evicted."""
        with self._cond:
            ranks = ", ".join(f"{s.rank}:{'out' if s.retired else s.busy or 'idle'}@v{s.version}" for s in self._slots)
            return (
                f"trainer v{self.trainer_version}, ranks [{ranks}], {len(self._ready)} ready, "
                f"{self._consumed} consumed, {len(self.lost)} lost, {len(self.evicted)} evicted"
            )

    @property
    def ready(self) -> int:
        """Finished batches waiting for the trainer."""
        with self._cond:
            return len(self._ready)

    @property
    def in_flight(self) -> int:
        """Generate calls running now."""
        with self._cond:
            return sum(1 for s in self._slots if s.busy == "generate")

    def rank_versions(self) -> list[int]:
        """The weight version each rollout rank holds, as the driver last learnt it."""
        with self._cond:
            return [s.version for s in self._slots]

    # -- shutdown ------------------------------------------------------------------
    def drain(self) -> None:
        """Start no new prompts: what runs finishes and can still be taken; then ``take`` raises ``StreamEnded``."""
        with self._cond:
            self._exhausted = True
            self._cond.notify_all()

    def close(self, *, timeout: float | None = 60.0) -> None:
        """Stop: start nothing more, wait for the running generate calls, drop every batch not taken.

        Running calls are waited for, not cancelled: a cancelled lazy call
        would leave its rows on the rank.  Every reference to rows is dropped,
        so the ranks free them (with the group's next call or its shutdown);
        the pump thread ends.
        """
        with self._cond:
            if self._closed:
                return
            self._closing = self._drop = True
            self._cond.notify_all()
        self._pump.join(timeout)
        with self._cond:
            self._closed = True
            self._ready.clear()
            self._requeued.clear()
            self._cond.notify_all()
        if self._pump.is_alive():
            raise DispatchTimeoutError(f"the rollout stream's calls did not end within {timeout} s: {self.describe()}")

    def __enter__(self) -> RolloutStream:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __iter__(self) -> Iterator[TakenStep]:
        """``for step in stream``: one :meth:`take` per step until the stream ends."""
        while True:
            try:
                yield self.take()
            except StreamEnded:
                return

    # -- the pump ------------------------------------------------------------------
    def _run(self) -> None:
        try:
            self._pump_loop()
        except BaseException as exc:  # noqa: BLE001 - a bug here must reach take(), not vanish with the thread
            with self._cond:
                self._fatal = self._fatal or DispatchRuntimeError(f"the rollout stream's pump failed: {exc!r}")
                self._cond.notify_all()

    def _pump_loop(self) -> None:
        while True:
            with self._cond:
                stopping = self._closing or self._fatal is not None  # a failed stream starts nothing more
                if stopping and not any(s.busy for s in self._slots):
                    return
                if not stopping:
                    self._revive()
                starts = [] if stopping or self._held else self._plan_starts()
            for slot, kind in starts:
                self._start(slot, kind)
            finished = [s for s in self._slots if s.busy and s.future is not None and s.future.done()]
            for slot in finished:
                self._finish(slot)
            if not starts and not finished:
                with self._cond:
                    self._cond.wait(_POLL)

    def _plan_starts(self) -> list[tuple[_Slot, str]]:
        """Under the lock: which idle ranks sync (first) and which generate (as the policy admits)."""
        starts: list[tuple[_Slot, str]] = []
        for slot in self._slots:
            if slot.busy or slot.retired is not None:
                continue
            if slot.fresh and self.weights_from is None:  # the caller gave it its weights (grow's sync=)
                slot.fresh = False
            target = self.trainer_version if self._target is None else self._target
            if slot.fresh or (self._target is not None and slot.version < target):
                slot.busy, slot.sync_version = "sync", target
                starts.append((slot, "sync"))
                continue
            if not self.policy.admit(self._state(self.trainer_version, slot.version)):
                continue
            batch = self._next_batch(slot)
            if batch is None:
                continue
            slot.busy, slot.batch = "generate", batch
            starts.append((slot, "generate"))
        return starts

    def _next_batch(self, slot: _Slot) -> RolloutBatch | None:
        if self._requeued:
            prompts, attempt = self._requeued.popleft()
        elif self._exhausted:
            return None
        else:
            try:
                prompts, attempt = next(self._prompts), 0
            except StopIteration:
                self._exhausted = True
                return None
        batch = RolloutBatch(self._seq, slot.rank, prompts, version=slot.version, attempt=attempt)
        self._seq += 1
        return batch

    def _start(self, slot: _Slot, kind: str) -> None:
        try:
            if kind == "sync":
                if slot.rank not in self._syncs:
                    self._syncs[slot.rank] = WeightSync(
                        self.weights_from, self.group.ranks([slot.rank]), **self._sync_options
                    )
                slot.future = self._syncs[slot.rank].start(slot.sync_version)
            else:
                assert slot.batch is not None  # noqa: S101 - set with busy by _plan_starts
                slot.batch.submitted = now_us() / 1e6
                slot.future = slot.proxy(slot.batch.prompts)
        except BaseException as exc:  # noqa: BLE001 - a refused call is that batch's (or sync's) failure
            slot.future = _Failed(exc)

    def _finish(self, slot: _Slot) -> None:
        try:
            value, error = slot.future.get(0), None
        except BaseException as exc:  # noqa: BLE001 - sorted below: a lost batch or a failed sync
            value, error = None, exc
        with self._cond:
            if error is not None and not isinstance(error, _OWN_ERRORS) and not self._usable():
                self._wait_out(slot, error)
            elif slot.busy == "sync":
                self._synced(slot, error)
            else:
                self._generated(slot, value, error)
            slot.busy, slot.future, slot.batch = "", None, None
            self._cond.notify_all()

    def _synced(self, slot: _Slot, error: BaseException | None) -> None:
        if error is None:
            slot.version = int(slot.sync_version or 0) if slot.fresh else max(slot.version, int(slot.sync_version or 0))
            slot.fresh = False
        elif isinstance(error, WorkerDiedError):
            self._retire(slot, error)
        else:
            self._fatal = error

    def _usable(self) -> bool:
        try:
            self.group.ensure_usable()
        except Exception:  # noqa: BLE001 - broken for now (a death being handled) or for good
            return False
        return True

    def _wait_out(self, slot: _Slot, error: BaseException | None) -> None:
        """A call refused because the group cannot take calls now (another rank's death is being handled):
        its batch goes back to the front, no attempt counted; the rank waits out until the group serves again."""
        if slot.busy == "generate" and slot.batch is not None:
            self._requeued.appendleft((slot.batch.prompts, slot.batch.attempt))
        slot.retired = error

    def _revive(self) -> None:
        """Under the lock: a retired rank of a group that takes calls again (replaced) generates again, fresh."""
        if not any(slot.retired is not None for slot in self._slots) or not self._usable():
            return  # none out, or the group still broken (no replacement yet): the ranks stay out
        for slot in self._slots:
            if slot.retired is not None and not slot.busy:
                revived = self._slot(slot.rank, self.trainer_version)
                slot.proxy, slot.version, slot.last_stamp = revived.proxy, revived.version, None
                slot.retired, slot.fresh = None, True
                self._syncs.pop(slot.rank, None)  # a new process: its transfers are planned again

    def _retire(self, slot: _Slot, error: BaseException) -> None:
        """A dead rank: generate nothing more there; its finished, untaken batches died with it, so regenerate them."""
        slot.retired = error
        for batch in [b for b in self._ready if b.rank == slot.rank]:
            self._ready.remove(batch)
            self.lost.append(LostBatch(batch.seq, slot.rank, error, True))
            self._requeued.append((batch.prompts, batch.attempt))

    def _generated(self, slot: _Slot, value: Any, error: BaseException | None) -> None:
        batch = slot.batch
        assert batch is not None  # noqa: S101 - a generate slot holds its batch
        if error is None:
            error = self._stamp(slot, batch, value)
        if error is None:
            if self._drop:
                return
            self._ready.append(batch)
            return
        cancelled = isinstance(error, CallCancelledError)
        if isinstance(error, WorkerDiedError):
            self._retire(slot, error)
        again = not self._closing and (cancelled or batch.attempt + 1 < self.max_attempts)
        self.lost.append(LostBatch(batch.seq, slot.rank, error, again))
        if again:
            self._requeued.appendleft((batch.prompts, batch.attempt + (0 if cancelled else 1)))
        elif not self._closing and self._fatal is None:
            self._fatal = error

    def _stamp(self, slot: _Slot, batch: RolloutBatch, value: Any) -> BaseException | None:
        meta = getattr(value, "meta_info", None)
        if not isinstance(meta, dict) or VERSION_KEY not in meta:
            return DispatchTypeError(
                f"{self.method!r} returned no weights version: decorate it with @versioned under @register "
                "(from dispatchcore import versioned), so each batch carries the version that made it"
            )
        oldest, newest = meta.pop(VERSION_KEY), meta.pop(NEWEST_KEY, None)  # kept on the batch: concat keeps meta equal
        batch.version = self.initial_version if oldest is None else int(oldest)
        batch.newest = batch.version if newest is None else int(newest)
        batch.data, batch.finished = value, now_us() / 1e6
        tracer = active_tracer()  # the pump runs in the stream creator's context: its trace block
        if tracer is not None:
            track = f"{self.group.trace_label} rank {slot.rank} batches"
            name = f"batch {batch.seq} v{batch.version}" + (f"-{batch.newest}" if batch.newest != batch.version else "")
            tracer.slice(track, name, batch.submitted * 1e6, batch.finished * 1e6, version=batch.version)
        if batch.version < slot.version:
            return DispatchRuntimeError(
                f"rollout rank {slot.rank} stamped version {batch.version} though it was told {slot.version}: "
                "without weights_from=, update the ranks' weights and weights_version yourself before publish()"
            )
        if slot.last_stamp is not None and batch.version < slot.last_stamp:
            return DispatchRuntimeError(
                f"rollout rank {slot.rank} stamped version {batch.version} after {slot.last_stamp}: versions go back"
            )
        slot.last_stamp = batch.version
        slot.version = max(slot.version, batch.newest)
        return None

    def _evict_stale(self) -> None:
        state = self._state(self.trainer_version)
        for batch in [b for b in self._ready if self.policy.evict(b, state)]:
            self._ready.remove(batch)
            # Regenerated up to max_attempts times, then dropped (a batch slower than k steps never fits).
            again = self.policy.on_stale == "regenerate" and not self._closing and batch.attempt + 1 < self.max_attempts
            self.evicted.append(Evicted(batch.seq, batch.rank, batch.version, self.trainer_version, again))
            if again:
                self._requeued.appendleft((batch.prompts, batch.attempt + 1))
            self._cond.notify_all()


class _Failed:
    """A call that could not even start: done at once, raising its error."""

    def __init__(self, error: BaseException) -> None:
        self._error = error

    def done(self) -> bool:
        return True

    def get(self, timeout: float | None = None) -> Any:
        raise self._error

    def cancel(self) -> bool:
        return False


def _method_of(generate: Any) -> tuple[Any, str]:
    """The group and method name behind ``rollout_wg.generate`` (a lazy-capable DataProto method)."""
    group, name = getattr(generate, "_group", None), getattr(generate, "_name", None)
    if group is None or name is None or not hasattr(group, "ranks"):
        raise DispatchTypeError(
            f"RolloutStream takes a rollout group's method, e.g. RolloutStream(rollout_wg.generate, ...), "
            f"got {generate!r}"
        )
    return group, name
