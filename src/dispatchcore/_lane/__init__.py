"""The control lane: direct, authenticated socket links between a driver and its ranks.

Written once for every process backend: the door and links, the driver side
(:class:`LaneDriver`), the rank side (:class:`LaneRank`), the call envelope
and :class:`LaneExecutor`.  ``docs/executor-contract.md`` ("The lane") is
the contract.
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
