"""verl's result shapes for ``blocking=False`` calls through ``RayWorkerGroup``: Ray refs, as verl ``ray.get`` s them.

These calls skip the core's pipeline hooks, as verl's have none (docs/porting-from-verl.md).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from dispatchcore import CallFuture, DataProtoFuture, Dispatch, Execute, Registration, direct_call

#: Modes whose non-blocking result is one ref per rank.
PER_RANK_MODES = frozenset({Dispatch.ONE_TO_ALL, Dispatch.ALL_TO_ALL, Dispatch.DP_COMPUTE, Dispatch.DP_COMPUTE_METRIC})
#: DataProto modes whose ``Execute.RANK_ZERO`` call gives one ref (rank 0's chunk).
RANK_ZERO_SPLITS = frozenset({Dispatch.DP_COMPUTE_PROTO, Dispatch.DP_COMPUTE_PROTO_WITH_FUNC})


class RefList(list):  # type: ignore[type-arg]
    """One Ray ``ObjectRef`` per rank: ``ray.get(refs)``, ``refs + other_refs``, or ``refs.get()``."""

    def get(self, timeout: float | None = None) -> list[Any]:
        """The values, in rank order (Ray's wait: unbounded unless ``timeout`` is given)."""
        import ray

        return list(ray.get(list(self), timeout=timeout))


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
        group, registration = self._group, self._registration
        group.ensure_usable()
        if registration.materialize_futures:
            args = tuple(_materialized(a) for a in args)
            kwargs = {k: _materialized(v) for k, v in kwargs.items()}
        rank_zero = registration.dispatch_mode is Dispatch.RANK_ZERO or registration.execute_mode is Execute.RANK_ZERO
        if registration.dispatch_mode is Dispatch.RANK_ZERO:
            per_rank = [(args, kwargs)]
        else:
            call = direct_call(registration.dispatch_mode, group.world_size, args, kwargs, method=self._name)
            per_rank = [call.inputs(r) for r in range(1 if rank_zero else group.world_size)]
        refs = send(group, self._name, per_rank)
        return refs[0] if rank_zero else refs

    def __getattr__(self, name: str) -> Any:  # ``options(...)`` too: the core's bounded ``CallFuture``, not refs
        return getattr(self._core, name)

    def __repr__(self) -> str:
        return f"<verl ref proxy {self._name} of {self._group!r}>"


def send(group: Any, name: str, per_rank: list[tuple[tuple[Any, ...], dict[str, Any]]], share: bool = True) -> RefList:
    """Start ``name`` on the group's first ``len(per_rank)`` ranks; with ``share``, an object shared is put once."""
    import ray

    counts = Counter(id(value) for a, kw in per_rank for value in (*a, *kw.values()))
    puts: dict[int, Any] = {}

    def shipped(value: Any) -> Any:
        if not share or counts[id(value)] < 2 or value is None or isinstance(value, (bool, int, float, str)):
            return value
        if id(value) not in puts:
            puts[id(value)] = ray.put(value)
        return puts[id(value)]

    executor, method = group._ray(), group.role_prefix + name
    refs = RefList()
    for position, (a, kw) in enumerate(per_rank):
        actor = executor.actor(group.rank_ids[position])
        refs.append(actor.call_plain.remote(method, *map(shipped, a), **{k: shipped(v) for k, v in kw.items()}))
    return refs


def _materialized(value: Any) -> Any:
    """A future argument resolved on the driver (verl's ``materialize_futures``)."""
    return value.get() if isinstance(value, (DataProtoFuture, CallFuture)) else value
