"""The executor contract: everything a backend plugin needs, and nothing private.

For executor authors; the contract is written out once, in
``docs/executor-contract.md``.  In short: the core owns dispatch, collect,
padding, futures, binding, every time bound and its own operations on the
ranks; an executor owns how ranks start, how bytes move and how death is
seen.  Subclass :class:`Executor`, set ``name`` and implement
``__init__(spec)`` (start ranks, each a :class:`WorkerHost`), ``submit(call)``
(send a :class:`Call` at once, return a :class:`RankCallHandle`; on the rank
``host.run(call.method, args, kwargs, call.instructions)``, forwarding
:class:`Instructions` whole and never reading them; route ``call.beside``
calls beside a busy call where you can) and ``shutdown()``; a backend whose
ranks are processes subclasses :class:`LaneExecutor` instead and writes only
how they start and stop (the core's lane carries the calls).  Optional hooks
(rows and futures moved rank to rank, rank stacks, cancels, replacing ranks,
weight transfers, collectives) decline by default.  The built-in executors
import only this module, :mod:`dispatchcore.wire` and public ``dispatchcore``
names; check yours with :class:`dispatchcore.testing.ExecutorConformance`.
"""

from __future__ import annotations

from .._base import check_options
from .._lane import (
    BulkPath,
    HandedOver,
    LaneAddress,
    LaneCallHandle,
    LaneDirectory,
    LaneDoor,
    LaneDriver,
    LaneExecutor,
    LaneLink,
    LaneRank,
    address_toward,
    connect_lane,
    frame_object,
    open_lane,
    unframe_object,
)
from .._rows import (
    HeldRows,
    RowAccess,
    RowRequest,
    free_kept_rows,
    holds_kept_rows,
    kept_results,
    take_kept_rows,
)
from .._runtime import (
    ATOMS,
    RankCallHandle,
    RankThread,
    RemoteFailure,
    WorkerHost,
    cancel_in_process,
    check_copyable,
    check_spec_picklable,
    first_failure,
    isolated_copy,
    liveness_poll,
    run_isolated,
    thread_stacks,
    timeout_error,
    unpicklable_error,
    unpicklable_spec_error,
)
from .._spi import (
    LOOPBACK,
    PLAIN,
    RANK_ENV_KEYS,
    Call,
    CallHandle,
    ChunkPlan,
    Executor,
    ForwardPlan,
    GroupSpec,
    Instructions,
    ResultShape,
    RowPiece,
    UniqueValues,
    assemble_chunk,
    cpu_thread_environment,
    free_port,
    local_ranks,
    plan_forward,
    rank_environment,
    register_executor,
    remaining,
)
from .._trace import TimedResult
from .._transfer import TensorLink, TensorSourceLost, TensorSpec, TransferPlan, plan_transfer, run_step
from .._wire import keep_freed_memory
from .._worker import STORE_ENV as COLLECTIVE_STORE_ENV
from .._worker import CollectiveLink, StoreCollective, ThreadCollective, method_names

__all__ = [
    "ATOMS",
    "COLLECTIVE_STORE_ENV",
    "LOOPBACK",
    "PLAIN",
    "RANK_ENV_KEYS",
    "BulkPath",
    "Call",
    "CallHandle",
    "ChunkPlan",
    "CollectiveLink",
    "Executor",
    "ForwardPlan",
    "GroupSpec",
    "HandedOver",
    "HeldRows",
    "Instructions",
    "LaneAddress",
    "LaneCallHandle",
    "LaneDirectory",
    "LaneDoor",
    "LaneDriver",
    "LaneExecutor",
    "LaneLink",
    "LaneRank",
    "RankCallHandle",
    "RankThread",
    "RemoteFailure",
    "ResultShape",
    "RowAccess",
    "RowPiece",
    "RowRequest",
    "StoreCollective",
    "TensorLink",
    "TensorSourceLost",
    "TensorSpec",
    "ThreadCollective",
    "TimedResult",
    "TransferPlan",
    "UniqueValues",
    "WorkerHost",
    "address_toward",
    "assemble_chunk",
    "cancel_in_process",
    "check_copyable",
    "check_options",
    "check_spec_picklable",
    "connect_lane",
    "cpu_thread_environment",
    "first_failure",
    "frame_object",
    "free_kept_rows",
    "free_port",
    "holds_kept_rows",
    "isolated_copy",
    "keep_freed_memory",
    "kept_results",
    "liveness_poll",
    "local_ranks",
    "method_names",
    "open_lane",
    "plan_forward",
    "plan_transfer",
    "rank_environment",
    "register_executor",
    "remaining",
    "run_isolated",
    "run_step",
    "take_kept_rows",
    "thread_stacks",
    "timeout_error",
    "unframe_object",
    "unpicklable_error",
    "unpicklable_spec_error",
]
