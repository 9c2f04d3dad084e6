"""Malformed calls turned into typed errors that name the problem and the fix.

The core runs user-supplied dispatch and collect functions and hands
arguments to executors it does not know.  What goes wrong there would
otherwise surface as a bare ``TypeError`` from deep inside the core or a
backend's pickler; these helpers catch it at the boundary and say which
call, which argument or rank, and what to do instead (docs/design.md, "Public names": every
error is a :class:`~dispatchcore.DispatchError`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .._base import DispatchError
from .._spi import Call, CallHandle, Executor


def _kind(value: Any) -> str:
    return type(value).__name__


def per_rank_values(dispatched: Any, mode_name: str, method: str) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``(args, kwargs)`` from a dispatch function's return value, or a :class:`DispatchError` saying what it returned.

    Per-entry lengths are checked where the call is built; this checks the outer shape.
    """
    if (
        not isinstance(dispatched, (tuple, list))
        or len(dispatched) != 2
        or not isinstance(dispatched[0], (tuple, list))
        or not isinstance(dispatched[1], Mapping)
    ):
        got = _kind(dispatched)
        if isinstance(dispatched, (tuple, list)):
            got += f" of {len(dispatched)} ({', '.join(_kind(v) for v in dispatched[:3])})"
        raise DispatchError(
            f"dispatch function of mode {mode_name!r} returned a {got} for call {method!r}; it must return "
            "(args, kwargs): a tuple with one per-rank list per positional argument and a dict of per-rank lists"
        )
    return tuple(dispatched[0]), dict(dispatched[1])


def submit_call(executor: Executor, call: Call, backend: str) -> CallHandle:
    """``executor.submit(call)``; a backend's own exception (usually its pickler's) becomes a DispatchError.

    Nothing was sent when ``submit`` raises (executors serialize every
    argument before the first send), so the group stays usable.
    """
    try:
        return executor.submit(call)
    except DispatchError:
        raise
    except Exception as exc:
        raise DispatchError(
            f"backend {backend!r} could not send the arguments of call {call.method!r} to its ranks "
            f"({_kind(exc)}: {exc}). Arguments must survive pickling to reach another process: pass plain "
            "data, tensors, numpy arrays or DataProto, not locks, open files, sockets or generators"
        ) from exc
