"""The control lane: direct, authenticated socket links between a driver and its ranks.

An executor whose ranks are separate processes needs a way to send them
commands and hear back that costs less than its backend's own call
mechanism (a store round trip, a Ray task).  The lane is that part, once,
for every executor: the driver opens a door (:func:`open_lane`: a listener
on one interface and a fresh token), tells its ranks where it is through a
:class:`LaneDirectory` the executor fills (the c10d store under torchrun,
Ray itself for Ray actors), each rank connects with :func:`connect_lane`,
and from then on one :class:`LaneLink` per rank carries whole messages in
order, sends never block, and a link that ends says the peer is gone.

On top of the links, the lane's two sides live here once for every process
backend: :class:`LaneDriver` (each rank's pending calls, one reader thread
per group, one liveness rule) and :class:`LaneRank` (calls on the rank's
method thread, pings, cancels and stacks beside them), the call envelope
(``_envelope``, with an optional :class:`BulkPath`), and
:class:`LaneExecutor`, the base that leaves a backend only its processes.
"""

from ._address import LaneAddress, LaneDirectory
from ._door import LaneDoor, address_toward, connect_lane, open_lane
from ._driver import LaneCallHandle, LaneDriver
from ._envelope import BulkPath, HandedOver
from ._executor import LaneExecutor
from ._framing import frame_object, unframe_object
from ._link import LaneLink
from ._rank import LaneRank

__all__ = [
    "BulkPath",
    "HandedOver",
    "LaneAddress",
    "LaneCallHandle",
    "LaneDirectory",
    "LaneDoor",
    "LaneDriver",
    "LaneExecutor",
    "LaneLink",
    "LaneRank",
    "address_toward",
    "connect_lane",
    "frame_object",
    "open_lane",
    "unframe_object",
]
