"""Moving named tensors between groups (weight sync): what sides declare, the plan, the rank side.

The driver side is ``_sync``; executors plug in a :class:`TensorLink`.  Imports ``_base``.
"""

from ._layout import Held, Shard, Slice, held_of, row_elements, rows_of
from ._plan import DEFAULT_BUCKET_BYTES, Bucket, Piece, TensorSpec, TransferPlan, Wanted, plan_transfer
from ._rank import TRANSFER_METHOD, VERSION_ATTRIBUTE, TensorLink, TensorSourceLost, run_step

__all__ = [
    "DEFAULT_BUCKET_BYTES",
    "TRANSFER_METHOD",
    "VERSION_ATTRIBUTE",
    "Bucket",
    "Held",
    "Piece",
    "Shard",
    "Slice",
    "TensorLink",
    "TensorSourceLost",
    "TensorSpec",
    "TransferPlan",
    "Wanted",
    "held_of",
    "plan_transfer",
    "row_elements",
    "rows_of",
    "run_step",
]
