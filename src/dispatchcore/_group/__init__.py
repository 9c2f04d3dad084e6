"""The driver's handle: ``WorkerGroup`` and the call pipeline (the top of the core: none imports it)."""

from ._method_proxy import MethodProxy
from ._stream import CallStream, StreamPart
from ._worker_group import WorkerGroup

__all__ = [
    "CallStream",
    "MethodProxy",
    "StreamPart",
    "WorkerGroup",
]
