"""How the program was launched, and the environment a rank is given.

Under torchrun every process already has ``RANK``, ``WORLD_SIZE``,
``MASTER_ADDR``... and ``TORCHELASTIC_RUN_ID``; the executor only reads them.
Outside torchrun the executor starts the ranks itself and hands each child
the same variables, never writing them into the driver's own ``os.environ``
(a notebook that later calls ``init_process_group`` must not find a stale
``RANK=0`` there).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping

#: Set by torchrun's elastic agent in every process it starts.
TORCHRUN_MARKER = "TORCHELASTIC_RUN_ID"


def under_torchrun(environ: Mapping[str, str] | None = None) -> bool:
    """Whether this process was started by torchrun (its agent's variables are present)."""
    env = os.environ if environ is None else environ
    return TORCHRUN_MARKER in env and "RANK" in env and "WORLD_SIZE" in env


def torchrun_world_size() -> int | None:
    """``WORLD_SIZE`` of the torchrun launch, or ``None`` outside torchrun."""
    return int(os.environ["WORLD_SIZE"]) if under_torchrun() else None


def torchrun_rank() -> int:
    return int(os.environ["RANK"])


def store_address() -> tuple[str, int]:
    """Where torchrun's agent store listens (``MASTER_ADDR:MASTER_PORT``)."""
    return os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])


def run_id() -> str:
    """A key prefix unique to this torchrun launch and restart."""
    return f"{os.environ.get(TORCHRUN_MARKER, 'none')}.{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (for the workers' own ``init_process_group``)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def child_env(rank: int, world_size: int, master_addr: str, master_port: int) -> dict[str, str]:
    """The torchrun-style variables one self-started rank gets (and only it)."""
    return {
        "RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_RANK": str(rank),
        "LOCAL_WORLD_SIZE": str(world_size),
        "GROUP_RANK": "0",
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
    }
