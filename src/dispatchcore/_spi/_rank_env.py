"""The environment a rank sees (torchrun's variables on every backend), and the port its process group meets on."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping, Sequence

from .._base import DispatchValueError

#: Variables the executor sets per rank; user-given worker env may not override them.
RANK_ENV_KEYS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")

LOOPBACK = "127.0.0.1"


def rank_environment(
    rank: int,
    world_size: int,
    *,
    master_addr: str,
    master_port: int,
    local_rank: int | None = None,
    local_world_size: int | None = None,
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """torchrun's variables for one rank, over ``extra`` (the user's, which may not set a rank variable)."""
    clash = sorted(set(extra or {}) & set(RANK_ENV_KEYS))
    if clash:
        raise DispatchValueError(f"worker environment may not set {clash}: the executor sets them per rank")
    return {
        **{str(k): str(v) for k, v in (extra or {}).items()},
        "RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_RANK": str(rank if local_rank is None else local_rank),
        "LOCAL_WORLD_SIZE": str(world_size if local_world_size is None else local_world_size),
        "MASTER_ADDR": str(master_addr),
        "MASTER_PORT": str(master_port),
    }


def cpu_thread_environment(ranks_on_host: int, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """``OMP_NUM_THREADS`` for a rank process that shares its host with ``ranks_on_host - 1`` others.

    torch sizes its pool to every core, so N ranks on one host oversubscribe
    it; each gets its share instead.  A value the user set is kept (``{}``).
    """
    env = os.environ if environ is None else environ
    if ranks_on_host <= 1 or "OMP_NUM_THREADS" in env:
        return {}
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return {"OMP_NUM_THREADS": str(max(1, cores // ranks_on_host))}


def local_ranks(node_of_rank: Sequence[str]) -> list[tuple[int, int]]:
    """``(LOCAL_RANK, LOCAL_WORLD_SIZE)`` per rank, counting ranks on the same node."""
    by_node: dict[str, list[int]] = {}
    for rank, node in enumerate(node_of_rank):
        by_node.setdefault(node, []).append(rank)
    return [(by_node[node].index(rank), len(by_node[node])) for rank, node in enumerate(node_of_rank)]


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port on ``host`` that was free a moment ago (``""``: every interface); another process may take it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])
