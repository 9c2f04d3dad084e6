"""How the program was launched (torchrun's variables, only read), and the CUDA device a rank uses."""

from __future__ import annotations

import os
from collections.abc import Mapping

import torch

from dispatchcore.executor import LOOPBACK, address_toward

#: Set by torchrun's elastic agent in every process it starts.
TORCHRUN_MARKER = "TORCHELASTIC_RUN_ID"
#: What a plain ``init_process_group()`` reads: made to describe a group's rank while it is served (``present_group``).
GROUP_KEYS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE")
#: The launch's own values of ``GROUP_KEYS``, kept once a group's replaced them in ``os.environ``.
_launch: dict[str, str] = {}


def launch_var(name: str, default: str | None = None) -> str:
    """The launch's value of torchrun's variable ``name``, even where a group's rank rewrote it."""
    if name in _launch:
        return _launch[name]
    return os.environ[name] if default is None else os.environ.get(name, default)


def present_group(env: Mapping[str, str]) -> None:
    """Make ``os.environ`` describe the group rank this process builds, so ``env://`` meets that group's ranks.

    The launch's values stay readable by :func:`launch_var` (this process's library still needs them).
    """
    for key in GROUP_KEYS:
        if key in os.environ and key not in _launch:
            _launch[key] = os.environ[key]
    os.environ.update(env)


def under_torchrun(environ: Mapping[str, str] | None = None) -> bool:
    """Whether this process was started by torchrun (its agent's variables are present)."""
    env = os.environ if environ is None else environ
    return TORCHRUN_MARKER in env and "RANK" in env and "WORLD_SIZE" in env


def torchrun_world_size() -> int | None:
    """``WORLD_SIZE`` of the torchrun launch, or ``None`` outside torchrun."""
    return int(launch_var("WORLD_SIZE")) if under_torchrun() else None


def spans_nodes() -> bool:
    """Whether the launch may have processes on other hosts (``LOCAL_WORLD_SIZE`` short of ``WORLD_SIZE``, or nodes)."""
    local = os.environ.get("LOCAL_WORLD_SIZE")
    return local is None or local != launch_var("WORLD_SIZE") or os.environ.get("GROUP_WORLD_SIZE", "1") != "1"


def listen_host() -> str:
    """Where the library's own listeners bind under the launcher: loopback on one node, else toward the store.

    Ranks on other nodes must reach the driver's lane door, meetings and gloo pairs; on one node nothing else should.
    """
    return address_toward(*store_address()) if spans_nodes() else LOOPBACK


def store_address() -> tuple[str, int]:
    """Where torchrun's agent store listens (``MASTER_ADDR:MASTER_PORT``)."""
    return launch_var("MASTER_ADDR"), int(launch_var("MASTER_PORT"))


def run_id() -> str:
    """A key prefix unique to this torchrun launch and restart."""
    return f"{os.environ.get(TORCHRUN_MARKER, 'none')}.{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"


def set_local_device() -> None:
    """Make the rank's ``LOCAL_RANK`` GPU current on the calling (serving) thread (docs/design.md, "Invariants")."""
    if torch.cuda.is_available() and "LOCAL_RANK" in os.environ:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]) % torch.cuda.device_count())
