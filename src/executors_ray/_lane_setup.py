"""What a Ray group decides about its lane: whether it can have one, where it listens, what rides it inline."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from dispatchcore import DispatchError, DispatchValueError
from dispatchcore.executor import LOOPBACK

#: Values and results up to this many bytes ride the lane, larger ones the object store (measured: 16 MiB
#: and up are faster by the store, 0.125-8 MiB 1.2-8x faster inline; DP echo, N = 2).
LANE_INLINE_BYTES = 8 << 20

#: Options of the call paths a Ray group no longer has, and the one value each may still be given (its old default).
REMOVED_OPTIONS: dict[str, Any] = {"lane": True, "compiled": False, "compiled_idle_s": None}

ONE_LANE = (
    "a Ray group has one call path, the control lane: calls and small results on one socket per actor, "
    "large values and results by the object store"
)


def refuse_removed(options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` less the removed ones left at their old defaults; any other use of one raises."""
    if used := sorted(name for name, keep in REMOVED_OPTIONS.items() if name in options and options[name] is not keep):
        said = ", ".join(f"{name}={options[name]!r}" for name in used)
        raise DispatchValueError(
            f"{said}: the option was removed with the Ray-task call path and the compiled graph ({ONE_LANE}); drop it"
        )
    return {name: value for name, value in options.items() if name not in REMOVED_OPTIONS}


def ray_client_error(address: Any, connected: bool) -> DispatchError | None:
    """Why a group cannot start over Ray Client (``ray://``: its actors cannot reach the driver), or ``None``."""
    if not connected and not str(address or "").startswith("ray://"):
        return None
    return DispatchError(
        f"Ray Client ({'connected' if connected else address}): a Ray group's actors must reach the driver's "
        f"control lane, and a Ray Client driver is outside the cluster ({ONE_LANE}); run the driver on the "
        "cluster instead, e.g. as a Ray job (ray job submit -- python driver.py) or on the head node"
    )


def refuse_ray_client(address: Any) -> None:
    """Raise :func:`ray_client_error`'s error for this process (before connecting, when not connected yet)."""
    import ray

    connected = ray.is_initialized()
    client = connected and bool(ray.util.client.ray.is_connected())
    error = ray_client_error(None if connected else address or os.environ.get("RAY_ADDRESS"), client)
    if error is not None:
        raise error


def inline_bytes(value: Any) -> int:
    """The ``lane_inline_bytes`` option, checked (``None``: :data:`LANE_INLINE_BYTES`)."""
    if value is None:
        return LANE_INLINE_BYTES
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise DispatchValueError(f"lane_inline_bytes must be an int >= 0 (bytes), got {value!r}")
    return value


def lane_host(ray: Any, infos: Sequence[dict[str, Any]]) -> str:
    """Loopback when every actor shares the driver's node; else the address Ray knows this node by."""
    here = ray.get_runtime_context().get_node_id()
    if infos:
        alone = all(info.get("node_id") == here for info in infos)
    else:  # attached: one live node means the actors share the driver's
        alone = len([n for n in ray.nodes() if n.get("Alive")]) == 1
    return LOOPBACK if alone else str(ray.util.get_node_ip_address())
