"""Moving named tensors between groups (weight sync): what sides declare, the plan, the rank side.

The driver side is ``_sync``; executors plug in a :class:`TensorLink`.  Imports ``_base``.
"""

from ._dtensor import offered_record, shard_rows
from ._errors import WeightMismatchError, WeightOfferError, WeightTypeError
from ._layout import Held, RowShard, Shard, Slice, held_of, row_elements, rows_of
from ._plan import DEFAULT_BUCKET_BYTES, Bucket, Piece, TensorSpec, TransferPlan, Wanted, plan_transfer
from ._rank import TRANSFER_METHOD, VERSION_ATTRIBUTE, TensorLink, TensorSourceLost, run_step

__all__ = [
    "DEFAULT_BUCKET_BYTES",
    "TRANSFER_METHOD",
    "VERSION_ATTRIBUTE",
    "Bucket",
    "Held",
    "Piece",
    "RowShard",
    "Shard",
    "Slice",
    "TensorLink",
    "TensorSourceLost",
    "TensorSpec",
    "TransferPlan",
    "Wanted",
    "WeightMismatchError",
    "WeightOfferError",
    "WeightTypeError",
    "held_of",
    "offered_record",
    "plan_transfer",
    "row_elements",
    "rows_of",
    "run_step",
    "shard_rows",
]
