"""Malformed calls (a user dispatch's bad return, a backend's pickler error) turned into typed errors with the fix."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .._base import DispatchError, UnpicklableError
from .._runtime import unpicklable_call_error
from .._spi import Call, CallHandle, Executor


def per_rank_values(dispatched: Any, mode_name: str, method: str) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``(args, kwargs)`` from a dispatch function's return value (its outer shape checked), else a DispatchError."""
    if (
        not isinstance(dispatched, (tuple, list))
        or len(dispatched) != 2
        or not isinstance(dispatched[0], (tuple, list))
        or not isinstance(dispatched[1], Mapping)
    ):
        got = type(dispatched).__name__
        if isinstance(dispatched, (tuple, list)):
            got += f" of {len(dispatched)} ({', '.join(type(v).__name__ for v in dispatched[:3])})"
        raise DispatchError(
            f"dispatch function of mode {mode_name!r} returned a {got} for call {method!r}; it must return "
            "(args, kwargs): a tuple with one per-rank list per positional argument and a dict of per-rank lists"
        )
    return tuple(dispatched[0]), dict(dispatched[1])


def submit_call(executor: Executor, call: Call, backend: str) -> CallHandle:
    """``executor.submit(call)``; a backend's own exception (nothing was sent) becomes a DispatchError."""
    try:
        return executor.submit(call)
    except UnpicklableError as exc:
        cause = exc.__cause__ if exc.__cause__ is not None else exc
        named = unpicklable_call_error(call, _worker_cls(executor), cause, in_process=exc.in_process)
        if named is None:
            raise
        raise named from cause
    except DispatchError:
        raise
    except Exception as exc:
        named = unpicklable_call_error(call, _worker_cls(executor), exc)
        if named is not None:
            raise named from exc
        raise DispatchError(
            f"backend {backend!r} could not send the arguments of call {call.method!r} to its ranks "
            f"({type(exc).__name__}: {exc}). Arguments must survive pickling to reach another process: pass plain "
            "data, tensors, numpy arrays or DataProto, not locks, open files, sockets or generators"
        ) from exc


def _worker_cls(executor: Executor) -> type | None:
    spec = getattr(executor, "spec", None)
    return getattr(spec, "worker_cls", None)
