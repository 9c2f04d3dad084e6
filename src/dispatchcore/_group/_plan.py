"""Stage 1 of a call: dispatch splits the arguments per rank; the ``CallContext`` it fills is the collect plan.

What the core tells every rank goes into the call's ``Instructions``, never into the user's keyword arguments.
"""

from __future__ import annotations

import itertools
import os
import random
from typing import Any

from .._base import DispatchError
from .._dispatch import CallContext, CallFuture, DispatchSpec, Execute, Registration, enter_call, leave_call
from .._rows import RemoteRows, send_lazy_arguments
from .._spi import PLAIN, Call, Instructions, call_instructions
from ._bind import bind_call
from ._call_checks import per_rank_values
from ._planned import PlannedCall
from ._site import CallSite

_keep_tokens = itertools.count()
#: Call ids (what a cancel names on the ranks): random high bits keep two drivers of one detached group apart.
_call_ids = itertools.count(random.getrandbits(30) << 32 | 1)
#: Looked up once: a member read through the enum's metaclass costs a method call.
_EXECUTE_RANK_ZERO = Execute.RANK_ZERO


def plan_call(
    group: Any,
    site: CallSite,
    name: str,
    registration: Registration,
    spec: DispatchSpec,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    timeout: float | None,
    lazy: bool | None,
) -> PlannedCall:
    """Dispatch ``args``/``kwargs`` over ``site``'s ranks into one :class:`Call`, with its collect plan."""
    unwrap = registration.execute_mode is _EXECUTE_RANK_ZERO
    if lazy is None:
        lazy = registration.lazy if registration.lazy is not None else site.shared.lazy
    lazy = lazy and spec.returns_dataproto
    ctx = CallContext(name, site.world_size)
    token = enter_call(ctx)
    try:
        if registration.materialize_futures and not spec.returns_dataproto and (args or kwargs):
            args, kwargs = _materialize(args, kwargs)
        per_rank_args, per_rank_kwargs = per_rank_values(spec.dispatch_fn(group, *args, **kwargs), spec.name, name)
    finally:
        leave_call(token)
    bind_call(site, group, name, per_rank_args, per_rank_kwargs, spec.name)  # before anything is sent
    per_rank_args, per_rank_kwargs, read_sources = _send_data(site, per_rank_args, per_rank_kwargs)
    keep = f"{os.getpid()}-{next(_keep_tokens)}" if lazy else None
    instructions = call_instructions(keep, next(_call_ids))
    call = build_call(
        site,
        name,
        spec.name,
        per_rank_args,
        per_rank_kwargs,
        rank_zero=spec.rank_zero_only or unwrap,
        timeout=timeout,
        copied=spec.returns_dataproto and not unwrap,
        instructions=instructions,
    )
    return PlannedCall(call, spec, ctx, lazy, unwrap, read_sources, site.shared.membership.generation)


def build_call(
    site: CallSite,
    name: str,
    mode_name: str,
    per_rank_args: Any,
    per_rank_kwargs: Any,
    *,
    rank_zero: bool,
    timeout: float | None,
    copied: bool = False,
    instructions: Instructions = PLAIN,
) -> Call:
    """Transpose per-rank lists into one argument tuple and keyword dict per rank (checked)."""
    n = site.world_size
    for i, v in enumerate((*per_rank_args, *per_rank_kwargs.values())):
        if not isinstance(v, (list, tuple)) or len(v) != n:
            where = (
                f"argument {i}"
                if i < len(per_rank_args)
                else f"keyword {list(per_rank_kwargs)[i - len(per_rank_args)]!r}"
            )
            size = f"{len(v)} entries" if isinstance(v, (list, tuple)) else f"a {type(v).__name__}"
            raise DispatchError(
                f"dispatch function of mode {mode_name!r} returned {where} of {name!r} as {size}; "
                f"it must be a list with one entry per rank ({n})"
            )
    # Per-rank lists are indexed by position in this group; the call names real ranks (views).
    ranks = site.ranks[:1] if rank_zero else site.ranks
    count = len(ranks)
    # Every list has n entries (checked above): zip transposes them into one tuple per rank.
    args = list(itertools.islice(zip(*per_rank_args, strict=True), count)) if per_rank_args else [()] * count
    if per_rank_kwargs:
        keys = tuple(per_rank_kwargs)
        per_rank = itertools.islice(zip(*per_rank_kwargs.values(), strict=True), count)
        kwargs = [dict(zip(keys, values, strict=True)) for values in per_rank]
    else:
        kwargs = [{} for _ in ranks]
    return Call(site.prefix + name, ranks, args, kwargs, timeout, copied, instructions)


def _send_data(
    site: CallSite, per_rank_args: tuple[Any, ...], per_rank_kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any], list[RemoteRows]]:
    """Lazy DataProto arguments as row requests (or driver-read rows), counting what the driver sends."""
    columns = [*per_rank_args, *per_rank_kwargs.values()]
    if not columns or not all(isinstance(c, (list, tuple)) for c in columns):
        return per_rank_args, per_rank_kwargs, []  # malformed: build_call says what the dispatch returned
    sent, sources = send_lazy_arguments(site.executor, columns)
    n = len(per_rank_args)
    return tuple(sent[:n]), dict(zip(per_rank_kwargs, sent[n:], strict=True)), sources


def _materialize(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    def get(v: Any) -> Any:
        return v.get() if isinstance(v, CallFuture) else v

    return tuple(get(a) for a in args), {k: get(v) for k, v in kwargs.items()}
