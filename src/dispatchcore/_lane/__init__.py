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

Imports nothing of dispatchcore.
"""

from ._address import LaneAddress, LaneDirectory
from ._door import LaneDoor, address_toward, connect_lane, open_lane
from ._framing import frame_object, unframe_object
from ._link import LaneLink

__all__ = [
    "LaneAddress",
    "LaneDirectory",
    "LaneDoor",
    "LaneLink",
    "address_toward",
    "connect_lane",
    "frame_object",
    "open_lane",
    "unframe_object",
]
