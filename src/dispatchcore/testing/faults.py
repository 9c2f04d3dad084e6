"""``backend="faulty"``: any backend, with ranks that raise, hang, die or are slow when you say.

The ranks run on the ``inner`` backend; a planted :class:`Fault` is acted out
on the driver's side of the executor seam, so nothing real is killed and every
kind works on threads.  Kinds and options: docs/testing.md.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from dispatchcore import (
    DispatchError,
    DispatchTimeoutError,
    DispatchTypeError,
    DispatchValueError,
    RemoteFailure,
    WorkerDiedError,
    WorkerError,
    WorkerGroup,
    hookimpl,
)
from dispatchcore.executor import Call, Executor, GroupSpec, RankCallHandle, check_options

__all__ = ["Fault", "FaultyExecutor", "FiredFault", "InjectedFault"]

FaultKind = Literal["raise", "hang", "die", "slow"]
KINDS: tuple[str, ...] = ("raise", "hang", "die", "slow")
BACKEND_ENV = "DISPATCHCORE_BACKEND"
#: While a failed call's gather runs, how often its other ranks are looked at.
FAIL_FAST_POLL_S = 0.01


class InjectedFault(RuntimeError):
    """What a ``raise`` fault raises on the rank unless it names its own exception."""


@dataclass(frozen=True)
class Fault:
    """One planted fault: ``kind`` on ``rank`` at the ``call``-th call of ``method``.

    Build one with :meth:`raise_on`, :meth:`hang`, :meth:`die` or :meth:`slow`.
    ``call`` counts from 1, per rank and method (``None``: every call);
    ``method`` is the name the ranks run (``"<role>_<method>"`` for a role of
    a colocated class).
    """

    kind: FaultKind
    rank: int
    method: str
    call: int | None = 1
    seconds: float = 0.0
    error: BaseException | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise DispatchValueError(f"Fault kind must be one of {KINDS}, got {self.kind!r}")
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 0:
            raise DispatchValueError(f"Fault rank must be an int >= 0, got {self.rank!r}")
        if not isinstance(self.method, str) or not self.method:
            raise DispatchValueError(f"Fault method must be a method name, got {self.method!r}")
        if self.call is not None and (isinstance(self.call, bool) or not isinstance(self.call, int) or self.call < 1):
            raise DispatchValueError(
                f"Fault call must be an int >= 1 (the k-th call, from 1) or None (every call), got {self.call!r}"
            )
        if self.kind == "slow" and (
            isinstance(self.seconds, bool) or not isinstance(self.seconds, (int, float)) or self.seconds <= 0
        ):
            raise DispatchValueError(f"Fault.slow needs seconds > 0, got {self.seconds!r}")
        if self.error is not None and not isinstance(self.error, BaseException):
            raise DispatchTypeError(
                f"Fault error must be an exception instance, e.g. ValueError('bad'), got {self.error!r}"
            )

    @classmethod
    def raise_on(cls, rank: int, method: str, call: int | None = 1, error: BaseException | None = None) -> Fault:
        """Rank ``rank`` raises ``error`` (default :class:`InjectedFault`) instead of running ``method``."""
        return cls("raise", rank, method, call, error=error)

    @classmethod
    def hang(cls, rank: int, method: str, call: int | None = 1) -> Fault:
        """Rank ``rank`` never answers that call, nor any later one."""
        return cls("hang", rank, method, call)

    @classmethod
    def die(cls, rank: int, method: str, call: int | None = 1) -> Fault:
        """Rank ``rank`` dies during that call (nothing real is killed)."""
        return cls("die", rank, method, call)

    @classmethod
    def slow(cls, rank: int, method: str, seconds: float, call: int | None = 1) -> Fault:
        """Rank ``rank``'s answer arrives no earlier than ``seconds`` after the call started."""
        return cls("slow", rank, method, call, seconds=seconds)

    def matches(self, rank: int, method: str, count: int) -> bool:
        """Whether this fault fires on the ``count``-th call of ``method`` reaching ``rank``."""
        return rank == self.rank and method == self.method and (self.call is None or self.call == count)

    def describe(self, count: int) -> str:
        return f"injected fault: rank {self.rank} {_VERBS[self.kind]} on call {count} of {self.method!r}"


_VERBS = {"raise": "raised", "hang": "hung", "die": "died", "slow": "was slow"}


@dataclass(frozen=True)
class FiredFault:
    """A fault that fired: which one, and on which call of its method (counted from 1)."""

    fault: Fault
    call: int


class _FaultyCallHandle(RankCallHandle):
    """One call: injected outcomes delivered at once, the rest pulled from the inner backend's handle."""

    def __init__(self, call: Call, *, death_timeout: float, on_broken: Callable[[str], None]) -> None:
        super().__init__(call, death_timeout=death_timeout, on_broken=on_broken)
        self._inner: Any = None
        self._inner_positions: list[int] = []
        self._due: dict[int, float] = {}  # position -> earliest delivery time (slow faults)
        self._held: dict[int, tuple[bool, Any]] = {}
        self._pulling = threading.Lock()
        #: The inner call ended (a rank raised or died) while some of its ranks ran on.
        self._inner_ended = False

    def attach(self, inner: Any, positions: list[int], due: dict[int, float]) -> None:
        self._inner, self._inner_positions, self._due = inner, positions, due

    # -- moving outcomes from the inner handle ------------------------------------
    def _take_inner(self, wait: float) -> None:
        """The inner call's outcome if it arrives within ``wait`` seconds."""
        inner = self._inner
        if self._inner_ended:
            self._settle_inner(wait)
            return
        try:
            try:
                values = inner.result(wait)
            except DispatchTimeoutError:
                if not inner.done():
                    return  # only this wait ran out
                values = inner.result(0.0)  # it ended as the wait ran out: its outcome (its own bound raises)
        except WorkerDiedError as exc:
            self.rank_died(self._position_of(exc.rank), exc.detail)
        except WorkerError as exc:
            failure = RemoteFailure(exc.rank, exc.method, exc.exc_type, exc.exc_message, exc.remote_traceback)
            self._hold({self._position_of(exc.rank): (False, failure)})
        else:
            self._inner = None
            self.row_buffers = inner.row_buffers
            self._hold({p: (True, v) for p, v in zip(self._inner_positions, values, strict=True)})
            return
        self._inner_ended = True
        self._settle_inner(0.0)

    def _settle_inner(self, wait: float) -> None:
        """The inner call failed early: its other ranks count as answered once they left it.

        One still in it stays waited on, or the next call would queue behind it unseen.
        """
        inner = self._inner
        settle = getattr(inner, "wait_settled", None)
        running = set(inner.waiting_ranks()) if settle is not None and not settle(wait) else set()
        left = set(self.waiting_positions()) - set(self._held) - {self._position_of(r) for r in running}
        self._hold({p: (True, None) for p in self._inner_positions if p in left})
        if not running:
            self._inner = None
            self._inner_ended = False

    def _position_of(self, rank: int) -> int:
        return self.call.ranks.index(rank)

    def _hold(self, outcomes: dict[int, tuple[bool, Any]]) -> None:
        self._held.update(outcomes)
        self._release_due()

    def _release_due(self) -> None:
        now = time.monotonic()
        for position in [p for p in self._held if self._due.get(p, 0.0) <= now]:
            self.deliver(position, *self._held.pop(position))

    # -- the pull-transport hooks of RankCallHandle -----------------------------
    def wait_for_progress(self, seconds: float) -> None:
        self._pump(seconds, self._event)

    def wait_settled(self, timeout: float) -> bool:
        """Pull the inner outcomes on past the call's end (cancel, fail fast) until every rank answered."""
        deadline = time.monotonic() + timeout
        settled = self.settled_latch()
        while not settled.is_set() and (left := deadline - time.monotonic()) > 0:
            self._pump(min(left, self.poll), settled)
        return settled.is_set()

    def _pump(self, seconds: float, until: Any) -> None:
        """Move outcomes from the inner handle for up to ``seconds``, or until ``until`` is set."""
        end = time.monotonic() + seconds
        if not self._pulling.acquire(timeout=seconds):
            return
        try:
            while not until.is_set():
                self._release_due()
                now = time.monotonic()
                if now >= end or until.is_set():
                    return
                wake = min([end, *(self._due.get(p, now) for p in self._held)])
                if self._inner is not None and not (self._inner_ended and until is self._event):
                    self._take_inner(max(0.0, wake - now))
                elif self._inner_ended:  # the call's gather runs: look at its other ranks, never block on them
                    until.wait(max(0.0, min(wake - now, FAIL_FAST_POLL_S)))
                    self._settle_inner(0.0)
                else:
                    until.wait(max(0.0, wake - now))
        finally:
            self._pulling.release()

    def done(self) -> bool:
        if not self._event.is_set() and self._pulling.acquire(blocking=False):
            try:
                if self._inner is not None and self._inner.done():
                    self._take_inner(0.0)
                self._release_due()
            finally:
                self._pulling.release()
        return self._event.is_set()

    def release(self, detail: str) -> None:
        """End the call: every rank still waited on is reported gone (the group is shutting down)."""
        for position in self.waiting_positions():
            self.rank_died(position, detail)


class FaultyExecutor(Executor):
    """Backend ``"faulty"``: the ``inner`` backend's ranks, with :class:`Fault` s acted out.

    Options: ``inner``, ``inner_options`` (a dict), ``faults``.  :meth:`of`
    reaches a group's executor to :meth:`plant` more faults or read :attr:`fired`.
    """

    name: ClassVar[str] = "faulty"

    def __init__(self, spec: GroupSpec) -> None:
        super().__init__(spec)
        options = check_options(self.name, spec.options, {"inner": None, "inner_options": {}, "faults": ()})
        inner = options["inner"] or os.environ.get(BACKEND_ENV) or "local"
        if inner == self.name:
            if options["inner"]:
                raise DispatchValueError(
                    "backend='faulty' wraps another backend; pass inner='local' (or 'ray', 'torchrun', ...)"
                )
            inner = "local"  # DISPATCHCORE_BACKEND=faulty: wrap the default
        if not isinstance(options["inner_options"], dict):
            raise DispatchTypeError(
                f"inner_options must be a dict of the {inner!r} backend's options, got {options['inner_options']!r}"
            )
        self.inner_backend: str = inner
        self.fired: list[FiredFault] = []
        self._faults: list[Fault] = []
        self._counts: dict[tuple[int, str], int] = {}
        self._dead: dict[int, str] = {}
        self._hung: set[int] = set()
        self._live: weakref.WeakSet[_FaultyCallHandle] = weakref.WeakSet()
        self._lock = threading.Lock()
        self._closed = False
        self.plant(*_as_faults(options["faults"]))
        self._group: WorkerGroup[Any] = WorkerGroup(
            spec.worker_cls,
            spec.world_size,
            backend=inner,
            init_args=spec.init_args,
            init_kwargs=dict(spec.init_kwargs),
            call_timeout=spec.call_timeout,
            death_timeout=spec.death_timeout,
            isolate=spec.isolate,
            name=spec.name,
            **options["inner_options"],
        )
        self._inner = self._group.executor

    @classmethod
    def of(cls, group: WorkerGroup[Any]) -> FaultyExecutor:
        """The faulty executor behind ``group`` (built with ``backend="faulty"``)."""
        executor = group.executor
        if not isinstance(executor, cls):
            raise DispatchTypeError(
                f"{group!r} runs on backend {group.backend!r}, not 'faulty'; build it with "
                "WorkerGroup(..., backend='faulty', inner=..., faults=[...])"
            )
        return executor

    # -- planting and reading faults ------------------------------------------
    def plant(self, *faults: Fault) -> None:
        """Add faults; a call count refers to calls since the group started."""
        for fault in faults:
            if not isinstance(fault, Fault):
                raise DispatchTypeError(
                    f"faults must be Fault objects (Fault.raise_on(...), Fault.die(...)), got {fault!r}"
                )
            if fault.rank >= self.spec.world_size:
                raise DispatchValueError(
                    f"{fault!r}: rank {fault.rank} is outside this group of {self.spec.world_size} ranks"
                )
            if self.spec.methods and fault.method not in self.spec.methods:
                near = difflib.get_close_matches(fault.method, self.spec.methods, n=3)
                hint = f"; did you mean {near}?" if near else f"; known: {sorted(self.spec.methods)}"
                raise DispatchValueError(
                    f"{fault!r}: {self.spec.worker_cls.__name__} has no method {fault.method!r} a call can run{hint}"
                )
            with self._lock:
                clash = next((f for f in self._faults if _overlap(f, fault)), None)
                if clash is not None:
                    raise DispatchValueError(
                        f"{fault!r} fires on the same call as {clash!r}; plant one fault per rank and call"
                    )
                self._faults.append(fault)

    def calls(self, method: str, rank: int = 0) -> int:
        """How many calls of ``method`` have reached ``rank`` so far."""
        with self._lock:
            return self._counts.get((rank, method), 0)

    @property
    def broken(self) -> str | None:
        inner = getattr(self, "_inner", None)
        return super().broken or (inner.broken if inner is not None else None)

    # -- the executor contract -------------------------------------------------
    def rank_stacks(self, ranks: Sequence[int], all_threads: bool, timeout: float) -> dict[int, str]:
        """The wrapped backend's answer: the faults run inside its ranks."""
        return self._inner.rank_stacks(ranks, all_threads, timeout)

    def cancel_call(self, call: Call, ranks: Sequence[int]) -> bool:
        """The wrapped backend stops the ranks it runs; a rank a fault hung or killed runs nothing to stop."""
        if self._closed:
            return False
        with self._lock:
            real = [rank for rank in ranks if rank not in self._dead and rank not in self._hung]
        return self._inner.cancel_call(call, real) if real else True

    def can_replace_ranks(self) -> bool:
        """Where the wrapped backend can, or while a fault has hung or killed a rank (replacing it is faked)."""
        if self._closed:
            return False
        with self._lock:
            faked = bool(self._dead or self._hung)
        return faked or self._inner.can_replace_ranks()

    def submit(self, call: Call) -> RankCallHandle:
        if self._closed:
            raise DispatchError("this faulty group is shut down")
        handle = _FaultyCallHandle(call, death_timeout=self.spec.death_timeout, on_broken=self.mark_broken)
        started = time.monotonic()
        run: list[int] = []
        due: dict[int, float] = {}
        acted: list[tuple[int, Fault | None, str]] = []  # (position, fault or None if already dead/hung, detail)
        with self._lock:
            for position, rank in enumerate(call.ranks):
                if rank in self._dead or rank in self._hung:
                    acted.append((position, None, self._dead.get(rank, "")))
                    continue
                count = self._counts[(rank, call.method)] = self._counts.get((rank, call.method), 0) + 1
                fault = next((f for f in self._faults if f.matches(rank, call.method, count)), None)
                if fault is not None:
                    self.fired.append(FiredFault(fault, count))
                if fault is None or fault.kind == "slow":
                    run.append(position)
                    if fault is not None:
                        due[position] = started + fault.seconds
                    continue
                acted.append((position, fault, fault.describe(count)))
                if fault.kind == "die":
                    self._dead[rank] = f"{fault.describe(count)} (nothing was killed)"
                elif fault.kind == "hang":
                    self._hung.add(rank)
            self._live.add(handle)
        if run:
            handle.attach(self._inner.submit(_subcall(call, run)), run, due)
        for position, fault, detail in acted:
            rank = call.ranks[position]
            if fault is not None and fault.kind == "raise":
                handle.deliver(position, False, _failure(rank, call.method, fault.error, detail))
            elif rank in self._dead:
                handle.rank_died(position, self._dead[rank])
            # a hung rank never answers: the call's timeout or shutdown() ends it
        return handle

    def replace_ranks(self, ranks: Sequence[int]) -> dict[str, str]:
        """Replace ``ranks`` on the inner backend; a rank only a fault "killed" comes back as it is.

        Where the inner backend cannot start ranks (local threads), the old
        worker is kept, so a driver's recovery path runs on a laptop.
        """
        with self._lock:
            faked = all(r in self._dead or r in self._hung for r in ranks)
        try:
            env = dict(self._inner.replace_ranks(ranks))
        except DispatchError:
            if not faked:
                raise
            env = {}
        with self._lock:
            for rank in ranks:
                self._dead.pop(rank, None)
                self._hung.discard(rank)
        return env

    def mark_usable(self) -> None:
        super().mark_usable()
        self._inner.mark_usable()

    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        with self._lock:
            handles = list(self._live)
        for handle in handles:
            handle.release("the group was shut down while this rank was still running the call")
        self._group.shutdown()


def _as_faults(faults: Any) -> list[Fault]:
    if isinstance(faults, Fault):
        return [faults]
    if not isinstance(faults, Sequence) or isinstance(faults, str):
        raise DispatchTypeError(f"faults must be a list of Fault objects, got {faults!r}")
    return list(faults)


def _overlap(a: Fault, b: Fault) -> bool:
    return a.rank == b.rank and a.method == b.method and (a.call is None or b.call is None or a.call == b.call)


def _subcall(call: Call, positions: list[int]) -> Call:
    """The part of ``call`` the inner backend runs, without a time bound (the outer handle owns it)."""
    return dataclasses.replace(
        call,
        ranks=tuple(call.ranks[p] for p in positions),
        args=[call.args[p] for p in positions],
        kwargs=[call.kwargs[p] for p in positions],
        timeout=None,
    )


def _failure(rank: int, method: str, error: BaseException | None, detail: str) -> RemoteFailure:
    """The record a rank sends when its method raises ``error``, traceback included."""
    try:
        raise (error if error is not None else InjectedFault(detail)).with_traceback(None)
    except BaseException as exc:  # noqa: BLE001 - any exception the user planted
        return RemoteFailure.capture(rank, method, exc)


@hookimpl
def dispatchcore_register_executors(register: Callable[[type[Any]], None]) -> None:
    """Entry point ``faulty`` (group ``dispatchcore``)."""
    register(FaultyExecutor)
