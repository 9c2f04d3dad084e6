"""dispatchcore: verl's single-controller model on any backend.

One driver calls ``wg.update_actor(batch)``; the ``@register`` decorator on
the worker method decides how the batch is split over the ranks and how
their results come back.  Executors (``local`` threads, ``torchrun``
processes, ``ray`` actors) are plugins found through pluggy.
"""

from ._base import _moved
from ._base._errors import (
    BackendNotFoundError,
    BatchSizeError,
    DispatchError,
    DispatchTimeoutError,
    MemoryBudgetError,
    RegistrationError,
    WorkerDiedError,
    WorkerError,
)
from ._data._dataproto import DataProto, DataProtoConfig, DataProtoItem, collate_fn
from ._data._meta_info import union_numpy_dict, union_tensor_dict, union_two_dict
from ._data._padding import PADDING_ROWS_KEY, chunk_with_padding, pad_dataproto_to_divisor, unpad_dataproto
from ._data._reshape import fold_batch_dim, unfold_batch_dim
from ._data._tensor_batch import TensorBatch
from ._dispatch._builtin_modes import concat_outputs, trim_padding
from ._dispatch._call_context import CallContext, current_call
from ._dispatch._direct_call import DirectCall, direct_call
from ._dispatch._enum import Execute
from ._dispatch._futures import CallFuture
from ._dispatch._modes import Dispatch, register_dispatch_mode, unregister_dispatch_mode, update_dispatch_mode
from ._dispatch._nd_dispatch import make_nd_compute_dataproto_dispatch_fn
from ._dispatch._proto_future import DataProtoFuture
from ._dispatch._register import register
from ._dispatch._registration import Registration
from ._dispatch._spec import DispatchSpec
from ._group._method_proxy import MethodProxy
from ._group._worker_group import WorkerGroup
from ._rows._lazy_dataproto import LazyDataProto
from ._runtime._worker_host import RemoteFailure, WorkerHost
from ._spi._call import Call, UniqueValues
from ._spi._executor_base import CallHandle, Executor, GroupSpec
from ._spi._hookspecs import hookimpl, hookspec
from ._spi._plugins import available_backends
from ._trace._driver_traffic import DriverTraffic, driver_traffic
from ._trace._tracer import Tracer, trace
from ._worker._colocate import ClassWithInitArgs, colocate, create_colocated_worker_cls
from ._worker._fused import create_colocated_worker_raw_cls
from ._worker._rejoin import MembershipChange
from ._worker._worker import Worker

__version__ = "0.1.0"

_moved.install()  # old private module paths (pickles written before the move) keep importing

__all__ = [
    "PADDING_ROWS_KEY",
    "BackendNotFoundError",
    "BatchSizeError",
    "Call",
    "CallContext",
    "CallFuture",
    "CallHandle",
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
    "TensorBatch",
    "Tracer",
    "UniqueValues",
    "Worker",
    "WorkerDiedError",
    "WorkerError",
    "WorkerGroup",
    "WorkerHost",
    "__version__",
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
]
