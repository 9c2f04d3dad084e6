"""How the program was launched (torchrun's variables, only read), and the CUDA device a rank uses."""

from __future__ import annotations

import os
from collections.abc import Mapping

import torch

#: Set by torchrun's elastic agent in every process it starts.
TORCHRUN_MARKER = "TORCHELASTIC_RUN_ID"


def under_torchrun(environ: Mapping[str, str] | None = None) -> bool:
    """Whether this process was started by torchrun (its agent's variables are present)."""
    env = os.environ if environ is None else environ
    return TORCHRUN_MARKER in env and "RANK" in env and "WORLD_SIZE" in env


def torchrun_world_size() -> int | None:
    """``WORLD_SIZE`` of the torchrun launch, or ``None`` outside torchrun."""
    return int(os.environ["WORLD_SIZE"]) if under_torchrun() else None


def store_address() -> tuple[str, int]:
    """Where torchrun's agent store listens (``MASTER_ADDR:MASTER_PORT``)."""
    return os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])


def run_id() -> str:
    """A key prefix unique to this torchrun launch and restart."""
    return f"{os.environ.get(TORCHRUN_MARKER, 'none')}.{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"


def set_local_device() -> None:
    """Make the rank's ``LOCAL_RANK`` GPU current on the calling (serving) thread (docs/design.md, "Invariants")."""
    if torch.cuda.is_available() and "LOCAL_RANK" in os.environ:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]) % torch.cuda.device_count())
