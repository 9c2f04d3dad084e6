"""Weight sync, driver side: ``WeightSync`` plans a transfer between two groups and keeps buckets in flight.

The top of the core beside ``_group``: it uses only ``WorkerGroup``'s public properties.
"""

from ._weight_sync import TransferFuture, TransferReport, WeightSync

__all__ = ["TransferFuture", "TransferReport", "WeightSync"]
