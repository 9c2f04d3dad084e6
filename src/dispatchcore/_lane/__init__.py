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
from ._secret import HANDSHAKE_TIMEOUT_S, LaneAuthError, accept_link, lane_secret, offer_link, use_lane_secret

__all__ = [
    "HANDSHAKE_TIMEOUT_S",
    "BulkPath",
    "HandedOver",
    "LaneAddress",
    "LaneAuthError",
    "LaneCallHandle",
    "LaneDirectory",
    "LaneDoor",
    "LaneDriver",
    "LaneExecutor",
    "LaneLink",
    "LaneRank",
    "accept_link",
    "address_toward",
    "connect_lane",
    "frame_object",
    "lane_secret",
    "offer_link",
    "open_lane",
    "unframe_object",
    "use_lane_secret",
]
