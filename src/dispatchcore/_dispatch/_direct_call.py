"""Run a mode's dispatch and collect without a group, under one (fresh) call context, to test a mode."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .._base import DispatchError, DispatchIndexError, DispatchValueError
from ._call_context import CallContext, enter_call, leave_call
from ._modes import resolve_mode


class _StandInGroup:
    """What dispatch and collect functions read from a group, without ranks."""

    def __init__(self, world_size: int, mesh: Mapping[str, Sequence[tuple[int, bool]]] | None) -> None:
        self.world_size = world_size
        self._meshes = {name: [(int(dp), bool(c)) for dp, c in info] for name, info in (mesh or {}).items()}
        for name, info in self._meshes.items():
            if len(info) != world_size:
                raise DispatchValueError(
                    f"mesh {name!r} gives (dp_rank, is_collect) for {len(info)} ranks; the world has {world_size}"
                )

    def mesh_ranks(self, mesh_name: str) -> list[tuple[int, bool]]:
        try:
            return self._meshes[mesh_name]
        except KeyError:
            raise DispatchError(
                f"this mode dispatches over mesh {mesh_name!r}; pass direct_call(..., "
                f"mesh={{{mesh_name!r}: [(dp_rank, is_collect) for each rank]}})"
            ) from None


class DirectCall:
    """One dispatched call (``args[j][r]``: what rank ``r`` receives), waiting for per-rank outputs to collect."""

    def __init__(self, method: str, mode: Any, group: Any, context: CallContext) -> None:
        self.method = method
        self.spec = resolve_mode(mode)
        self.group = group
        self.world_size = int(group.world_size)
        self.context = context
        self.args: tuple[list[Any], ...] = ()
        self.kwargs: dict[str, list[Any]] = {}

    def inputs(self, rank: int) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The positional and keyword arguments rank ``rank`` receives."""
        if not 0 <= rank < self.world_size:
            raise DispatchIndexError(f"rank {rank} is outside the world of {self.world_size}")
        return tuple(a[rank] for a in self.args), {k: v[rank] for k, v in self.kwargs.items()}

    def collect(self, outputs: Sequence[Any]) -> Any:
        """The caller's result from one output per rank, as the mode collects it."""
        if len(outputs) != self.world_size:
            raise DispatchValueError(f"collect needs one output per rank ({self.world_size}), got {len(outputs)}")
        token = enter_call(self.context)
        try:
            return self.spec.collect_fn(self.group, list(outputs))
        finally:
            leave_call(token)

    def run(self, compute: Callable[..., Any]) -> Any:
        """Call ``compute(*args, **kwargs)`` with each rank's inputs, then collect."""
        return self.collect([compute(*a, **kw) for a, kw in map(self.inputs, range(self.world_size))])


def direct_call(
    mode: Any,
    world_size: int,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    *,
    mesh: Mapping[str, Sequence[tuple[int, bool]]] | None = None,
    method: str = "<direct>",
) -> DirectCall:
    """Dispatch ``args``/``kwargs`` with ``mode`` over ``world_size`` ranks, no group needed.

    ``mesh``: for nd modes, each rank's ``(dp_rank, is_collect)`` per mesh name.
    Collect with :meth:`DirectCall.collect` (or :meth:`DirectCall.run`).
    """
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise DispatchValueError(f"world_size must be an int >= 1, got {world_size!r}")
    group = _StandInGroup(world_size, mesh)
    call = DirectCall(method, mode, group, CallContext(method, world_size))
    token = enter_call(call.context)
    try:
        per_args, per_kwargs = call.spec.dispatch_fn(group, *args, **dict(kwargs or {}))
    finally:
        leave_call(token)
    for where, value in [(f"argument {i}", v) for i, v in enumerate(per_args)] + [
        (f"keyword {k!r}", v) for k, v in per_kwargs.items()
    ]:
        if not isinstance(value, (list, tuple)) or len(value) != world_size:
            raise DispatchError(
                f"dispatch function of mode {call.spec.name!r} returned {where} as {type(value).__name__}"
                f"{f' of length {len(value)}' if isinstance(value, (list, tuple)) else ''}; it must be a "
                f"list with one entry per rank ({world_size})"
            )
    call.args = tuple(list(a) for a in per_args)
    call.kwargs = {k: list(v) for k, v in per_kwargs.items()}
    return call
