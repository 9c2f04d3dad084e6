"""The control lane: direct, authenticated socket links between a driver and its ranks.

Door, links, driver and rank sides, envelope, ``LaneExecutor``: ``docs/executor-contract.md`` ("The lane").
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
