"""The executor contract's core side (public: ``dispatchcore.executor``); imports ``_base``, ``_wire``, ``_data``."""

from ._call import PLAIN, Call, Instructions, Operation, UniqueValues, call_instructions
from ._executor_base import CallHandle, Executor, GroupSpec, remaining
from ._forward_plan import assemble_chunk, plan_forward, trimmed_rows
from ._hookspecs import hookimpl, hookspec
from ._plugins import (
    available_backends,
    backends_replacing_ranks,
    get_executor_class,
    register_executor,
    registry,
    replaces_ranks,
)
from ._rank_env import LOOPBACK, RANK_ENV_KEYS, cpu_thread_environment, free_port, local_ranks, rank_environment
from ._row_pieces import ChunkPlan, ForwardPlan, ResultShape, RowPiece

__all__ = [
    "LOOPBACK",
    "PLAIN",
    "RANK_ENV_KEYS",
    "Call",
    "CallHandle",
    "ChunkPlan",
    "Executor",
    "ForwardPlan",
    "GroupSpec",
    "Instructions",
    "Operation",
    "ResultShape",
    "RowPiece",
    "UniqueValues",
    "assemble_chunk",
    "available_backends",
    "backends_replacing_ranks",
    "call_instructions",
    "cpu_thread_environment",
    "free_port",
    "get_executor_class",
    "hookimpl",
    "hookspec",
    "local_ranks",
    "plan_forward",
    "rank_environment",
    "register_executor",
    "registry",
    "remaining",
    "replaces_ranks",
    "trimmed_rows",
]
