"""The per-call settings ``wg.method.options(...)`` takes, checked with the same words as ``WorkerGroup(...)``'s."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .._base import DispatchTypeError, DispatchValueError, did_you_mean

#: Sentinel: "use the group's call_timeout" (typed Any so it can default any parameter).
DEFAULT: Any = object()
#: What a call past its timeout does: raise, leaving the ranks running (group broken), or cancel it on them.
ON_TIMEOUT = ("raise", "cancel")
#: The keywords ``.options()`` takes.
CALL_OPTIONS = ("blocking", "lazy", "on_timeout", "timeout")


def check_timeout(label: str, value: Any, allow_none: bool = True) -> float | None:
    """``value`` as seconds, or ``None``; anything else is refused naming ``label``."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        allowed = " or None" if allow_none else ""
        raise DispatchValueError(f"{label} must be a positive number of seconds{allowed}, got {value!r}")
    return float(value)


def check_call_options(unknown: Mapping[str, Any], timeout: Any, lazy: Any, on_timeout: Any, blocking: Any) -> None:
    """Refuse a misspelt keyword (with the nearest) or a bad value, naming what is allowed."""
    if unknown:
        names = sorted(unknown)
        hints = "".join(did_you_mean(name, CALL_OPTIONS) for name in names)
        raise DispatchTypeError(
            f".options() got unknown keyword(s) {names}{hints}; it takes: {', '.join(CALL_OPTIONS)}"
        )
    if on_timeout is not None and on_timeout not in ON_TIMEOUT:
        hint = did_you_mean(on_timeout, ON_TIMEOUT) if isinstance(on_timeout, str) else ""
        raise DispatchValueError(f"on_timeout must be one of {list(ON_TIMEOUT)}, got {on_timeout!r}{hint}")
    if timeout is not DEFAULT:
        check_timeout("timeout", timeout)
    if lazy is not None and not isinstance(lazy, bool):
        raise DispatchValueError(f"lazy must be True, False or None, got {lazy!r}")
    if blocking is not None and not isinstance(blocking, bool):
        raise DispatchValueError(
            f"blocking must be True, False or None, got {blocking!r}; blocking=False returns a future at once"
        )
