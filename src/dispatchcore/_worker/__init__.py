"""The rank side of a group: the worker base class, mesh declarations, colocation, rejoin.

The face re-exports the worker module's names, which were
``dispatchcore._worker``'s before the core became packages.
"""

from ._collective import STORE_ENV, CollectiveLink, StoreCollective, ThreadCollective, listening_store
from ._collective_ops import RankInfo, all_reduce, barrier, broadcast, broadcast_object, rank_info
from ._colocate import ClassWithInitArgs, colocate, create_colocated_worker_cls
from ._fused import create_colocated_worker_raw_cls
from ._handover import StateHandover, hands_over, load_replica, replica_version
from ._mesh_query import mesh_info
from ._method_names import method_names
from ._process_group import init_process_group
from ._rank_context import (
    CancelFlag,
    call_cancelled,
    enter_method,
    leave_method,
    rank_context,
    swap_collective,
)
from ._rejoin import REJOIN_CALL, MembershipChange, rejoin
from ._resize import GroupResized, holds_sharded_group, renumber
from ._sharded import (
    SHARDED_CALL,
    ShardedReport,
    declares_sharded,
    sharded_hooks,
    sharded_report,
    sharded_state,
)
from ._worker import Worker

__all__ = [
    "REJOIN_CALL",
    "SHARDED_CALL",
    "STORE_ENV",
    "CancelFlag",
    "ClassWithInitArgs",
    "CollectiveLink",
    "GroupResized",
    "MembershipChange",
    "RankInfo",
    "ShardedReport",
    "StateHandover",
    "StoreCollective",
    "ThreadCollective",
    "Worker",
    "all_reduce",
    "barrier",
    "broadcast",
    "broadcast_object",
    "call_cancelled",
    "colocate",
    "create_colocated_worker_cls",
    "create_colocated_worker_raw_cls",
    "declares_sharded",
    "enter_method",
    "hands_over",
    "holds_sharded_group",
    "init_process_group",
    "leave_method",
    "listening_store",
    "load_replica",
    "mesh_info",
    "method_names",
    "rank_context",
    "rank_info",
    "rejoin",
    "renumber",
    "replica_version",
    "sharded_hooks",
    "sharded_report",
    "sharded_state",
    "swap_collective",
]
