"""DataProto <-> tensordict.TensorDict conversion (tensordict is optional; the class is passed in)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any, TypeVar

import numpy as np
import torch

from dispatchcore._base._errors import DispatchImportError, DispatchTypeError, DispatchValueError
from dispatchcore._data._rows_like import RowsLike
from dispatchcore._data._tensor_batch import TensorBatch

__all__ = ["from_tensordict", "to_tensordict"]

D = TypeVar("D", bound=RowsLike)

#: ``to_tensordict`` entry giving ``{column: (dtype, row_shape)}`` for columns that are not 1-D object arrays.
_COLUMN_LAYOUT_KEY = "_dispatchcore_column_layout"


def from_tensordict(
    cls: type[D],
    tensor_dict: Any = None,
    meta_info: Mapping[str, Any] | None = None,
    num_batch_dims: int = 1,
) -> D:
    """A ``cls`` built from a TensorDict as :func:`to_tensordict` lays it out (stacks read with ``tolist()``)."""
    td = _import_tensordict()
    if num_batch_dims != 1:
        raise DispatchValueError(f"only num_batch_dims=1 is supported, got {num_batch_dims}")
    if not isinstance(tensor_dict, td.TensorDictBase):
        raise DispatchTypeError(f"from_tensordict needs a tensordict.TensorDict, got {type(tensor_dict).__name__}")
    meta = dict(meta_info or {})
    tensors: dict[str, torch.Tensor] = {}
    rows: dict[str, list[Any]] = {}
    for key, value in tensor_dict.items():
        if isinstance(value, td.NonTensorStack):
            rows[key] = value.tolist()
        elif isinstance(value, td.NonTensorData):
            meta[key] = value.data
        elif isinstance(value, torch.Tensor):
            tensors[key] = value
        else:
            raise DispatchTypeError(f"from_tensordict: unsupported entry {key!r} of type {type(value).__name__}")
    layouts = meta.pop(_COLUMN_LAYOUT_KEY, None) or {}
    non_tensors = {
        key: _column_from_rows(values, *layouts.get(key, (np.dtype(object), ()))) for key, values in rows.items()
    }
    size = list(tensor_dict.batch_size[:1])
    batch = TensorBatch(tensors, batch_size=size) if tensors else None
    return cls(batch=batch, non_tensor_batch=non_tensors, meta_info=meta)


def to_tensordict(data: RowsLike) -> Any:
    """A TensorDict of ``data``'s tensors, non-tensor columns and meta info.

    Each column is a ``NonTensorStack`` of rows wrapped one by one; columns that are not 1-D object arrays
    record dtype and row shape so they come back exactly.
    """
    td = _import_tensordict()
    tensor_keys = list(data.batch.keys()) if data.batch is not None else []
    counts = Counter([*tensor_keys, *data.non_tensor_batch, *data.meta_info, _COLUMN_LAYOUT_KEY])
    clash = sorted(str(key) for key, n in counts.items() if n > 1)
    if clash:
        raise DispatchValueError(
            f"to_tensordict: keys {clash} appear in more than one of batch, non_tensor_batch, meta_info "
            f"(or are the reserved {_COLUMN_LAYOUT_KEY!r}); one TensorDict holds them all"
        )
    out = td.TensorDict(
        data.batch.to_dict() if data.batch is not None else {},
        batch_size=[len(data)],
    )
    layouts: dict[str, tuple[np.dtype[Any], tuple[int, ...]]] = {}
    for key, column in data.non_tensor_batch.items():
        if column.dtype != object or column.ndim != 1:
            layouts[key] = (column.dtype, column.shape[1:])
        out[key] = td.NonTensorStack(*[td.NonTensorData(data=row) for row in column])
    for key, value in data.meta_info.items():
        out.set_non_tensor(key, value)
    if layouts:
        out.set_non_tensor(_COLUMN_LAYOUT_KEY, layouts)
    return out


def _column_from_rows(rows: list[Any], dtype: np.dtype[Any], row_shape: tuple[int, ...]) -> np.ndarray:
    """A column of ``rows``; object rows are set one by one so numpy never unpacks a list row."""
    column = np.empty((len(rows), *row_shape), dtype=dtype)
    if column.dtype == object:
        for i, row in enumerate(rows):
            column[i] = row
    elif rows:
        column[...] = rows
    return column


def _import_tensordict() -> Any:
    """tensordict, imported on use: it is an optional dependency."""
    try:
        import tensordict
    except ImportError as exc:
        raise DispatchImportError(
            "DataProto.from_tensordict / to_tensordict need tensordict: pip install tensordict"
        ) from exc
    return tensordict
