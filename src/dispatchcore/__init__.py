"""dispatchcore: verl's single-controller model on any backend.

One driver calls ``wg.update_actor(batch)``; the ``@register`` decorator on
the worker method decides how the batch is split over the ranks and how
their results come back.  Executors (``local`` threads, ``torchrun``
processes, ``ray`` actors) are plugins found through pluggy.
"""

from ._base import (
    BackendNotFoundError,
    BatchSizeError,
    CallCancelledError,
    CallInterrupted,
    DispatchError,
    DispatchTimeoutError,
    MemoryBudgetError,
    RegistrationError,
    WorkerDiedError,
    WorkerError,
    _moved,
)
from ._data import (
    PADDING_ROWS_KEY,
    DataProto,
    DataProtoConfig,
    DataProtoItem,
    TensorBatch,
    chunk_with_padding,
    collate_fn,
    fold_batch_dim,
    pad_dataproto_to_divisor,
    unfold_batch_dim,
    union_numpy_dict,
    union_tensor_dict,
    union_two_dict,
    unpad_dataproto,
    values_equal,
)
from ._dispatch import (
    CallContext,
    CallFuture,
    DataProtoFuture,
    DirectCall,
    Dispatch,
    DispatchSpec,
    Execute,
    Registration,
    as_completed,
    concat_outputs,
    current_call,
    direct_call,
    make_nd_compute_dataproto_dispatch_fn,
    register,
    register_dispatch_mode,
    trim_padding,
    unregister_dispatch_mode,
    update_dispatch_mode,
)
from ._group import CallStream, MethodProxy, StreamPart, WorkerGroup
from ._rows import LazyDataProto
from ._runtime import RemoteFailure, WorkerHost
from ._spi import Call, CallHandle, Executor, GroupSpec, UniqueValues, available_backends, hookimpl, hookspec
from ._sync import TransferFuture, TransferReport, WeightSync
from ._trace import DriverTraffic, Tracer, driver_traffic, trace
from ._transfer import Shard, Slice
from ._worker import (
    ClassWithInitArgs,
    MembershipChange,
    Worker,
    colocate,
    create_colocated_worker_cls,
    create_colocated_worker_raw_cls,
)

__version__ = "0.1.0"

_moved.install()  # old private module paths (pickles written before the move) keep importing

__all__ = [
    "PADDING_ROWS_KEY",
    "BackendNotFoundError",
    "BatchSizeError",
    "Call",
    "CallCancelledError",
    "CallContext",
    "CallFuture",
    "CallHandle",
    "CallInterrupted",
    "CallStream",
    "ClassWithInitArgs",
    "DataProto",
    "DataProtoConfig",
    "DataProtoFuture",
    "DataProtoItem",
    "DirectCall",
    "Dispatch",
    "DispatchError",
    "DispatchSpec",
    "DispatchTimeoutError",
    "DriverTraffic",
    "Execute",
    "Executor",
    "GroupSpec",
    "LazyDataProto",
    "MembershipChange",
    "MemoryBudgetError",
    "MethodProxy",
    "Registration",
    "RegistrationError",
    "RemoteFailure",
    "Shard",
    "Slice",
    "StreamPart",
    "TensorBatch",
    "Tracer",
    "TransferFuture",
    "TransferReport",
    "UniqueValues",
    "WeightSync",
    "Worker",
    "WorkerDiedError",
    "WorkerError",
    "WorkerGroup",
    "WorkerHost",
    "__version__",
    "as_completed",
    "available_backends",
    "chunk_with_padding",
    "collate_fn",
    "colocate",
    "concat_outputs",
    "create_colocated_worker_cls",
    "create_colocated_worker_raw_cls",
    "current_call",
    "direct_call",
    "driver_traffic",
    "fold_batch_dim",
    "hookimpl",
    "hookspec",
    "make_nd_compute_dataproto_dispatch_fn",
    "pad_dataproto_to_divisor",
    "register",
    "register_dispatch_mode",
    "trace",
    "trim_padding",
    "unfold_batch_dim",
    "union_numpy_dict",
    "union_tensor_dict",
    "union_two_dict",
    "unpad_dataproto",
    "unregister_dispatch_mode",
    "update_dispatch_mode",
    "values_equal",
]
