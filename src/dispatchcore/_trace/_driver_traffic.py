"""Bytes of batch data that crossed the driver: the figure lazy results shrink.

Counting starts with the first :func:`driver_traffic` call; cumulative: subtract two snapshots.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from .._data import DataProto

_lock = threading.Lock()
_sent = 0
_received = 0
#: Off until someone asks for the figures (see the module doc).
counting = False


@dataclass(frozen=True)
class DriverTraffic:
    """Cumulative DataProto payload bytes the driver sent to and received from ranks."""

    sent_bytes: int
    received_bytes: int

    @property
    def total(self) -> int:
        return self.sent_bytes + self.received_bytes

    def __sub__(self, other: DriverTraffic) -> DriverTraffic:
        return DriverTraffic(self.sent_bytes - other.sent_bytes, self.received_bytes - other.received_bytes)


def driver_traffic() -> DriverTraffic:
    """A snapshot of the bytes of batch data that crossed this driver so far (counted from the first snapshot)."""
    global counting
    counting = True
    return DriverTraffic(_sent, _received)


def payload_bytes(data: Any) -> int:
    """Bytes of a DataProto's tensors and numpy columns (0 for anything else)."""
    if not isinstance(data, DataProto) or data.is_lazy:
        return 0
    batch = data._batch
    tensors = sum(t.nbytes for t in batch._tensors.values()) if batch is not None else 0
    return tensors + sum(column.nbytes for column in data.non_tensor_batch.values())


def count_sent(values: Iterable[Any]) -> None:
    """Add the payload of DataProto ``values`` (each object once) to the bytes sent."""
    if counting:
        seen = {id(v): v for v in values if isinstance(v, DataProto)}
        count_sent_bytes(sum(payload_bytes(v) for v in seen.values()))


def count_received(values: Iterable[Any]) -> None:
    """Add the payload of DataProto ``values`` to the bytes received."""
    if counting:
        count_received_bytes(sum(payload_bytes(v) for v in values if isinstance(v, DataProto)))


def count_sent_bytes(size: int) -> None:
    """Add ``size`` bytes (driver-side columns of a lazy argument) to the bytes sent."""
    global _sent
    if size and counting:
        with _lock:
            _sent += size


def count_received_bytes(size: int) -> None:
    """Add ``size`` bytes (tensors a weight transfer moved through the driver) to the bytes received."""
    global _received
    if size and counting:
        with _lock:
            _received += size
