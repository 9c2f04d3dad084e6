"""The driver's handle: ``WorkerGroup``, method proxies, views, membership, and the call pipeline (plan
→ submit → resolve → collect).

The top of the core: it imports every layer below and none imports it.
"""

from ._method_proxy import MethodProxy
from ._stream import CallStream, StreamPart
from ._worker_group import WorkerGroup

__all__ = [
    "CallStream",
    "MethodProxy",
    "StreamPart",
    "WorkerGroup",
]
