"""Tracing and driver-traffic counting: what a call did and what crossed the driver.

The face re-exports the tracer's names, which were ``dispatchcore._trace``'s
before the core became packages (old pickles and imports keep working).
"""

from ._tracer import TimedResult, Tracer, active_tracer, now_us, trace

__all__ = ["TimedResult", "Tracer", "active_tracer", "now_us", "trace"]
