"""``DispatchSpec``: a mode's driver-side functions and how the core treats the call."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .._base import DispatchKeyError

DispatchFn = Callable[..., tuple[tuple[list[Any], ...], dict[str, list[Any]]]]
CollectFn = Callable[[Any, list[Any]], Any]


@dataclass(frozen=True)
class DispatchSpec:
    """A mode's driver-side functions and how the core should treat it."""

    dispatch_fn: DispatchFn
    collect_fn: CollectFn
    returns_dataproto: bool = False
    rank_zero_only: bool = False
    direct: bool = False
    name: str = "custom"
    #: One of the core's own modes: its collect takes the receive buffers from the collect plan.
    builtin: bool = False

    def __getitem__(self, key: str) -> Any:  # verl passes modes as dicts
        if key in ("dispatch_fn", "collect_fn"):
            return getattr(self, key)
        raise DispatchKeyError(key)
