"""Ray's bulk path beside the core's lane: large values and object references go by the object store.

A kept result's reference stays on its token (:class:`KeptResult`), so another Ray group reads it without the driver.
"""

from __future__ import annotations

import itertools
import secrets
import threading
from dataclasses import dataclass, field
from typing import Any

from dispatchcore import DispatchRuntimeError, WorkerDiedError
from dispatchcore.executor import HandedOver
from dispatchcore.wire import Serialized

from ._forward import resolve
from ._rank_actors import RankActors
from ._store import is_object_ref, pack, serialized
from ._tags import ROWS_GROUP, Forwarded

#: How often a rank waiting for a stashed value checks that its driver is still there.
STASH_POLL_S = 0.5


@dataclass(eq=False)
class KeptResult:
    """A rank's result kept in its actor until the driver takes it (a token on the lane)."""

    rank: int
    key: int
    #: Set on the driver: the ``take_result`` reference holding the result, and the group it came from.
    ref: Any = field(default=None, compare=False)
    source: RankActors | None = field(default=None, compare=False, repr=False)


class DriverBulk:
    """The driver's side (see the module docstring)."""

    private = False

    def __init__(self, rank_actors: RankActors, inline_bytes: int) -> None:
        #: Values larger than ``lane_inline_bytes`` go by the object store.
        self.min_bytes = inline_bytes + 1
        #: Every rank on the driver's node: a call's large values share one ``ray.put`` (one store round trip).
        self.bundle = False
        self._group = rank_actors
        self._keys = itertools.count()
        #: Names this driver's stash keys apart from another driver's on a shared (detached) actor.
        self._id = secrets.token_hex(4)
        #: The large values of the call being packed on this thread: (key, packed, ranks).
        self._gathered = threading.local()

    def claims(self, value: Any) -> bool:
        return isinstance(value, Forwarded) or is_object_ref(value)

    def put(self, value: Any, ranks: tuple[int, ...]) -> Any:
        """Stash ``value`` on each of ``ranks``: a claimed value now, as it is; a large pickle at :meth:`flush`."""
        key = (self._id, next(self._keys))
        if isinstance(value, Serialized):
            self._pending().append((key, pack(value), ranks))
        else:
            self._stash(key, ranks, True, (value,))  # a 1-tuple: Ray passes a reference on unresolved
        return key

    def flush(self) -> None:
        """Put the call's large values: one object for all with :attr:`bundle`, else one each (a node reads its own)."""
        pending, self._gathered.values = self._pending(), []
        if not pending:
            return
        put = self._group.ray.put
        if self.bundle and len(pending) > 1:
            ref = put(tuple(packed for _, packed, _ in pending))
            for member, (key, _, ranks) in enumerate(pending):
                self._stash(key, ranks, False, ref, member)
            return
        for key, packed, ranks in pending:
            self._stash(key, ranks, False, put(packed))

    def _pending(self) -> list[tuple[Any, Any, tuple[int, ...]]]:
        values = getattr(self._gathered, "values", None)
        if values is None:
            values = self._gathered.values = []
        return values

    def _stash(self, key: Any, ranks: tuple[int, ...], as_is: bool, carried: Any, member: int | None = None) -> None:
        """A ``stash`` task per rank (``rows`` group); Ray resolves a top-level reference in ``carried`` first."""
        for rank in ranks:
            self._group.actors[rank].stash.options(concurrency_group=ROWS_GROUP).remote(key, as_is, carried, member)

    def get(self, token: KeptResult) -> Serialized | HandedOver:
        """A result a rank kept: one ``take_result`` task (``rows`` group), bounded by ``death_timeout``."""
        group = self._group
        ref = group.actors[token.rank].take_result.options(concurrency_group=ROWS_GROUP).remote(token.key)
        token.ref, token.source = ref, group  # what a consuming Ray group can read without the driver
        try:
            kept = group.ray.get(ref, timeout=group.death_timeout)
        except group.ray.exceptions.RayActorError as exc:  # it answered, then died before the result was read
            raise WorkerDiedError(token.rank, group.gone(token.rank, exc)) from exc
        return HandedOver(kept) if is_object_ref(kept) else serialized(kept)


class _Stash:
    def __init__(self) -> None:
        self.arrived = threading.Event()
        self.as_is = False
        self.value: Any = None


class Shelf:
    """What a rank actor holds for its lanes: stashed call values on their way in, results kept for the driver."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stashes: dict[Any, _Stash] = {}
        self._kept: dict[int, Any] = {}
        self._keys = itertools.count()

    def keep(self, value: Any) -> int:
        key = next(self._keys)
        with self._lock:
            self._kept[key] = value
        return key

    def take_result(self, key: int) -> Any:
        with self._lock:
            return self._kept.pop(key)

    def arrive(self, key: Any, as_is: bool, carried: Any, member: int | None) -> None:
        """A ``stash`` task brought call value ``key`` (``member`` of ``carried`` when a call's values share one)."""
        entry = self.entry(key)
        entry.as_is = as_is
        entry.value = carried[0] if as_is else carried if member is None else carried[member]
        entry.arrived.set()

    def entry(self, key: Any) -> _Stash:
        with self._lock:
            return self._stashes.setdefault(key, _Stash())

    def drop(self, key: Any) -> None:
        with self._lock:
            self._stashes.pop(key, None)


class RankBulk:
    """A rank actor's side of one lane (see the module docstring), over the actor's :class:`Shelf`."""

    private = False

    def __init__(self, rank: int, inline_bytes: int, shelf: Shelf) -> None:
        self.min_bytes = inline_bytes + 1
        #: The rank this lane's driver knows the actor by (its tokens name it).
        self.rank = rank
        self._shelf = shelf
        #: Set once this lane's driver is gone: a stashed value waited for would never come.
        self.driver_gone = threading.Event()

    def claims(self, value: Any) -> bool:
        return is_object_ref(value)  # e.g. a weight bucket the worker put: Ray hands it over

    def put(self, value: Any, ranks: tuple[int, ...]) -> KeptResult:
        """Keep a result for the driver's ``take_result``."""
        return KeptResult(self.rank, self._shelf.keep(value if is_object_ref(value) else pack(value)))

    def get(self, key: Any) -> Serialized | HandedOver:
        """Stashed value ``key`` (waiting for its task): a packed pickle, or a value Ray handed over."""
        entry = self._shelf.entry(key)
        while not entry.arrived.wait(STASH_POLL_S):
            if self.driver_gone.is_set():
                break
        self._shelf.drop(key)
        if not entry.arrived.is_set():
            raise DispatchRuntimeError("the driver's lane closed before the call's arguments arrived")
        if not entry.as_is:
            return serialized(entry.value)
        if isinstance(entry.value, Forwarded):
            return HandedOver(resolve(entry.value))  # a fresh join: private whatever ``isolate`` says
        return HandedOver(entry.value)
