"""Tracing and driver-traffic counting: what a call did and what crossed the driver."""

from ._driver_traffic import (
    DriverTraffic,
    count_received,
    count_received_bytes,
    count_sent,
    count_sent_bytes,
    driver_traffic,
)
from ._tracer import TimedResult, Tracer, active_tracer, now_us, trace

__all__ = [
    "DriverTraffic",
    "TimedResult",
    "Tracer",
    "active_tracer",
    "count_received",
    "count_received_bytes",
    "count_sent",
    "count_sent_bytes",
    "driver_traffic",
    "now_us",
    "trace",
]
