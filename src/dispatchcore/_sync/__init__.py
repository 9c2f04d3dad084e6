"""Weight sync, driver side: ``WeightSync`` plans a transfer between two groups and keeps buckets in flight.

The top of the core beside ``_group``: it uses only ``WorkerGroup``'s public properties.
"""

from .._group._membership import use_replica_transfer
from ._weight_sync import TransferFuture, TransferReport, WeightSync

use_replica_transfer(WeightSync)  # a replaced rank takes a live replica's state with it

__all__ = ["TransferFuture", "TransferReport", "WeightSync"]
