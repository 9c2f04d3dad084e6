"""The batch containers: ``DataProto``, ``TensorBatch``, padding, ``meta_info`` rules, reshaping,
mini-batches, TensorDict interop.  Imports ``_base`` and ``_wire``.
"""

from ._coerce import as_index
from ._dataproto import DataProto, DataProtoItem, collate_fn
from ._meta_info import merge_meta_info, union_numpy_dict, union_tensor_dict, union_two_dict, values_equal
from ._padding import (
    AUTO_PADDING_KEY,
    PADDING_ROWS_KEY,
    DataProtoConfig,
    chunk_with_padding,
    kept_result_rows,
    pad_dataproto_to_divisor,
    unpad_dataproto,
)
from ._reshape import fold_batch_dim, unfold_batch_dim
from ._tensor_batch import TensorBatch
from ._tensordict_split import chunk_tensordict, concat_tensordicts, is_tensordict, slice_rows

__all__ = [
    "AUTO_PADDING_KEY",
    "PADDING_ROWS_KEY",
    "DataProto",
    "DataProtoConfig",
    "DataProtoItem",
    "TensorBatch",
    "as_index",
    "chunk_tensordict",
    "chunk_with_padding",
    "collate_fn",
    "concat_tensordicts",
    "fold_batch_dim",
    "is_tensordict",
    "kept_result_rows",
    "merge_meta_info",
    "pad_dataproto_to_divisor",
    "slice_rows",
    "unfold_batch_dim",
    "union_numpy_dict",
    "union_tensor_dict",
    "union_two_dict",
    "unpad_dataproto",
    "values_equal",
]
