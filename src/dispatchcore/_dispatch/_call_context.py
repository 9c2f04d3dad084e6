"""Per-call state a mode's dispatch tells its collect (verl's signatures cannot carry it): :func:`current_call`."""

from __future__ import annotations

import contextvars
from dataclasses import dataclass, field
from typing import Any


@dataclass
class CallContext:
    """What one call's dispatch tells its collect."""

    method: str
    world_size: int
    #: Rows added by padding, and the padded batch length they belong to.
    pad_size: int = 0
    padded_len: int = 0
    #: Positions (into the outputs list) to collect, in order; None = all.
    collect_positions: list[int] | None = None
    #: The executor's receive buffers for this call's results (collect may adopt their rows).
    row_buffers: Any = None
    extra: dict[str, Any] = field(default_factory=dict)


_current: contextvars.ContextVar[CallContext | None] = contextvars.ContextVar("dispatchcore_call", default=None)


def enter_call(ctx: CallContext) -> contextvars.Token[CallContext | None]:
    """Make ``ctx`` current until :func:`leave_call` with the token returned."""
    return _current.set(ctx)


def leave_call(token: contextvars.Token[CallContext | None]) -> None:
    _current.reset(token)


def current_call() -> CallContext:
    """The context of the call being dispatched or collected (outside a call, a fresh throwaway one)."""
    ctx = _current.get()
    return ctx if ctx is not None else CallContext(method="<direct>", world_size=0)
