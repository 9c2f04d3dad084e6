"""The weight version a rollout rank stamps on what it generates (``docs/async-rl.md``).

``@versioned`` wraps a worker's generate method: the version the rank held
when the call began is the batch's (oldest) version, the one it holds at the
end its newest; both ride the result's ``meta_info``, which comes back with
a lazy call, so the driver learns them without fetching a row.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

from .._base import DispatchTypeError

#: ``meta_info`` keys a versioned result carries.
VERSION_KEY = "weights_version"
NEWEST_KEY = "weights_version_newest"

F = TypeVar("F", bound=Callable[..., Any])


def weights_version_of(worker: Any) -> Any:
    """The version ``WeightSync`` committed on this worker (a colocated role: on its host); ``None`` before any."""
    own = getattr(worker, "__dict__", {})
    found = own.get("weights_version")
    host = own.get("_dispatchcore_colocated_host")
    if found is None and host is not None and host() is not None:
        found = host().__dict__.get("weights_version")
    return found


def versioned(method: F) -> F:
    """Stamp a generate method's ``DataProto`` result with the rank's weight version (oldest and newest).

    Put it under ``@register``: ``@register(Dispatch.DP_COMPUTE_PROTO)`` then ``@versioned``.
    """
    if not callable(method):
        raise DispatchTypeError(f"@versioned decorates a worker method, got {method!r}")

    @functools.wraps(method)
    def stamped(self: Any, *args: Any, **kwargs: Any) -> Any:
        oldest = weights_version_of(self)
        result = method(self, *args, **kwargs)
        newest = weights_version_of(self)
        meta = getattr(result, "meta_info", None)
        if not isinstance(meta, dict):
            raise DispatchTypeError(
                f"@versioned {method.__qualname__} must return a DataProto (its rows get the version), "
                f"got {type(result).__name__}"
            )
        meta[VERSION_KEY] = oldest
        meta[NEWEST_KEY] = newest
        return result

    return stamped  # type: ignore[return-value]
