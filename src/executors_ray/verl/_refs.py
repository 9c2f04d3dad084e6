"""verl's result shapes for ``blocking=False`` calls through ``RayWorkerGroup``: Ray refs, as verl ``ray.get`` s them.

The call goes through the group's pipeline like any other (bounded, traced,
setup-logged); each ref is the object store's hand-over of one rank's
outcome (``RankActor.hand_over``), which a driver thread fills once the
pipeline's result is in (docs/porting-from-verl.md).
"""

from __future__ import annotations

import contextlib
import secrets
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any

from dispatchcore import CallFuture, Dispatch, DispatchError, Execute, Registration

from .._runtime import in_session
from .._tags import HANDOVER_GROUP, ROWS_GROUP, Raised

#: Modes whose non-blocking result is one ref per rank.
PER_RANK_MODES = frozenset({Dispatch.ONE_TO_ALL, Dispatch.ALL_TO_ALL, Dispatch.DP_COMPUTE, Dispatch.DP_COMPUTE_METRIC})
#: DataProto modes whose ``Execute.RANK_ZERO`` call gives one ref (rank 0's chunk).
RANK_ZERO_SPLITS = frozenset({Dispatch.DP_COMPUTE_PROTO, Dispatch.DP_COMPUTE_PROTO_WITH_FUNC})


class RefList(list):  # type: ignore[type-arg]
    """One Ray ``ObjectRef`` per rank: ``ray.get(refs)``, ``refs + other_refs``, or ``refs.get()``."""

    def __init__(self, refs: list[Any], outcome: Callable[[float | None], list[Any]] | None = None) -> None:
        super().__init__(refs)
        self._outcome = outcome

    def get(self, timeout: float | None = None) -> list[Any]:
        """The values, in rank order, within the call's own bounds (``timeout``: a tighter one)."""
        if self._outcome is None:
            import ray

            return list(ray.get(list(self), timeout=timeout))
        return self._outcome(timeout)


def gives_refs(registration: Registration) -> bool:
    """Whether a method's non-blocking result takes verl's ref shape (see the module docstring)."""
    if registration.blocking:
        return False
    mode = registration.dispatch_mode
    if mode in PER_RANK_MODES or mode is Dispatch.RANK_ZERO:
        return True
    # Rank 0 alone of a DP split: one ref, as verl (an nd or user mode keeps the core's future).
    return registration.execute_mode is Execute.RANK_ZERO and mode in RANK_ZERO_SPLITS


class RefProxy:
    """A ``blocking=False`` method of a ``RayWorkerGroup`` returning Ray refs; the core proxy behind it."""

    def __init__(self, group: Any, name: str, registration: Registration, core: Any) -> None:
        self._group = group
        self._name = name
        self._registration = registration
        self._core = core
        self.__name__ = self.__qualname__ = name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        registration = self._registration
        future: CallFuture[Any] = self._core.options(blocking=False)(*args, **kwargs)  # sent now, in call order
        rank_zero = registration.dispatch_mode is Dispatch.RANK_ZERO or registration.execute_mode is Execute.RANK_ZERO
        refs = hand_over(self._group, future.get, 1 if rank_zero else len(self._group.rank_ids), not rank_zero)
        return refs[0] if rank_zero else refs

    def __getattr__(self, name: str) -> Any:  # ``options(...)`` too: the core's bounded ``CallFuture``, not refs
        return getattr(self._core, name)

    def __repr__(self) -> str:
        return f"<verl ref proxy {self._name} of {self._group!r}>"


def by_name(group: Any, method: str, args: tuple[Any, ...], kwargs: dict[str, Any], rank_zero: bool) -> Any:
    """verl's ``execute_*_async``: ``execute_all``/``execute_rank_zero`` on a thread, in the order they were asked."""
    group.ensure_usable()
    turns = _turns_of(group.executor)
    turn = turns.take()

    def run(timeout: float | None) -> Any:
        with turns.serving(turn):
            call = group.execute_rank_zero if rank_zero else group.execute_all
            return call(method, *args, **kwargs)

    refs = hand_over(group, run, 1 if rank_zero else len(group.rank_ids), not rank_zero)
    return refs[0] if rank_zero else refs


def hand_over(group: Any, outcome: Callable[[float | None], Any], count: int, per_rank: bool) -> RefList:
    """A ref per rank (the group's first ``count``) that holds its part of ``outcome()`` once a thread has it."""
    executor = group.executor
    actors = [executor.actor(rank) for rank in group.rank_ids[:count]]
    keys = [("handover", secrets.token_hex(8), position) for position in range(count)]
    task = [actor.hand_over.options(concurrency_group=HANDOVER_GROUP) for actor in actors]
    refs = [hand.remote(key) for hand, key in zip(task, keys, strict=True)]
    box: dict[str, Any] = {}
    done = threading.Event()

    def fill() -> None:
        try:
            value = outcome(None)
            parts = list(value) if per_rank else [value]
            if len(parts) != count:
                raise DispatchError(f"the call gave {len(parts)} results for {count} ranks")
            box["value"] = parts
        except BaseException as exc:  # noqa: BLE001 - each ref raises it at ray.get
            box["error"], parts = exc, [Raised(exc)] * count
        finally:
            done.set()
        if in_session(executor.ray, executor.session):  # a Ray call after ray.shutdown() would start a new Ray
            for actor, key, part in zip(actors, keys, parts, strict=True):
                _stash(actor, key, part)

    def wait(timeout: float | None) -> list[Any]:
        if not done.wait(timeout):
            raise DispatchError(f"the call's results did not arrive within {timeout:g} s")
        if "error" in box:
            raise box["error"]
        values: list[Any] = box["value"]
        return values

    threading.Thread(target=fill, name="dispatchcore-ray-handover", daemon=True).start()
    return RefList(refs, wait)


def _stash(actor: Any, key: Any, part: Any) -> None:
    """Hand ``part`` to the rank's waiting ``hand_over`` (a result Ray cannot pickle is handed as its error)."""
    try:
        actor.stash.options(concurrency_group=ROWS_GROUP).remote(key, True, (part,))
    except Exception as exc:  # noqa: BLE001 - unpicklable, or the actor is gone (its ref failed already)
        error = DispatchError(f"the result could not be handed to Ray's object store: {type(exc).__name__}: {exc}")
        try:
            actor.stash.options(concurrency_group=ROWS_GROUP).remote(key, True, (Raised(error),))
        except Exception:  # noqa: BLE001, S110 - the actor is gone: its ref says so
            pass


class _Turns:
    """Calls by name run one at a time per group, in the order they were asked (``by_name``)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._next = 0
        self._now = 0

    def take(self) -> int:
        with self._cond:
            self._next += 1
            return self._next - 1

    @contextlib.contextmanager
    def serving(self, turn: int) -> Iterator[None]:
        with self._cond:
            self._cond.wait_for(lambda: self._now == turn)
        try:
            yield
        finally:
            with self._cond:
                self._now += 1
                self._cond.notify_all()


_all_turns: weakref.WeakKeyDictionary[Any, _Turns] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def _turns_of(executor: Any) -> _Turns:
    with _lock:
        turns = _all_turns.get(executor)
        if turns is None:
            turns = _all_turns[executor] = _Turns()
        return turns
