"""What a Ray group decides about its control lane: whether to use it, where it listens, how a call is laid out.

The lane itself is ``_lane``; the executor only asks these questions once
per group (and per call for :func:`lane_tasks`), so they live apart from it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from dispatchcore import DispatchTypeError, DispatchValueError
from dispatchcore.executor import LOOPBACK, PLAIN, Call

from . import _payload
from ._tags import NO_ARGS, Layout, bare_layout
from ._task_layout import rank_task

#: Values and results up to this many bytes ride the lane; larger ones the object store.  Measured (DP echo,
#: N = 2, one run): per-rank values of 0.125-8 MiB are 1.2-8x faster inline, 16 MiB and up faster by the store.
LANE_INLINE_BYTES = 8 << 20
#: How long actors may take to connect to the driver's lane before calls fall back to Ray tasks.
LANE_CONNECT_S = 30.0
log = logging.getLogger("dispatchcore.ray")


def lane_wanted(lane: Any, ray: Any, name: str) -> bool:
    """Whether to try the lane: asked for, and not over Ray Client (its actors cannot reach this driver)."""
    if not isinstance(lane, bool):
        raise DispatchTypeError(f"lane must be True or False, got {lane!r}")
    if lane and ray.util.client.ray.is_connected():
        log.warning("ray group %r: connected through Ray Client, so its calls go as Ray tasks (no control lane)", name)
        return False
    return lane


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
    if infos and all(info.get("node_id") == here for info in infos):
        return LOOPBACK
    if not infos and len([n for n in ray.nodes() if n.get("Alive")]) == 1:
        return LOOPBACK
    return str(ray.util.get_node_ip_address())


def lane_tasks(call: Call, put: Callable[[Any], Any], bundle: bool, inline_max: int) -> list[tuple[Layout, list[Any]]]:
    """Each rank's layout and top-level values for the lane (raises ``_payload.EncodeError``)."""
    if not any(call.args) and not any(call.kwargs):
        layout = NO_ARGS if call.instructions == PLAIN else bare_layout(call.instructions)
        return [(layout, [])] * len(call.ranks)
    unique = call.unique_values()
    encoded = _payload.encode_for_lane(unique.values, put, bundle, inline_max)
    return [rank_task(call, unique, encoded, p) for p in range(len(call.ranks))]
