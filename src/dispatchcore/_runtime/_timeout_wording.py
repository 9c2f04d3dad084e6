"""The one wording of a call timeout, in a module of its own so the pipeline's hooks can use it lightly."""

from __future__ import annotations

from .._base import DispatchTimeoutError


def timeout_error(method: str, timeout: float | None, waiting_on: list[int]) -> DispatchTimeoutError:
    """The one wording of a call timeout (or of ``__init__`` past ``start_timeout``), naming the ranks still running."""
    if method == "__init__":
        message = (
            f"workers did not finish __init__ within {timeout:g} s (start_timeout); still waiting on rank(s) "
            f"{waiting_on}. They may be deadlocked (e.g. waiting on each other, or on ranks that never came, "
            "in init_process_group()) or only slow; if only slow, raise the bound with "
            "WorkerGroup(..., start_timeout=...)"
        )
    elif timeout is not None:
        message = (
            f"call {method!r} did not finish within {timeout:g} s; still waiting on rank(s) {waiting_on}. "
            f"Raise the bound with wg.{method}.options(timeout=...) or WorkerGroup(call_timeout=...)"
        )
    else:
        message = f"call {method!r} timed out waiting on rank(s) {waiting_on}"
    return DispatchTimeoutError(message, method=method, ranks=tuple(waiting_on))
