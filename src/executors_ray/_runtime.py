"""Connecting to Ray lazily: the executor class must import without ray (docs/executor-contract.md)."""

from __future__ import annotations

import contextlib
import ipaddress
import os
import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import Any

#: Namespace of detached groups (named actors are visible only inside one).
DETACHED_NAMESPACE = "dispatchcore"


def ensure_ray(options: Mapping[str, Any]) -> Any:
    """The ``ray`` module, connected: this process's Ray, ``address``/``RAY_ADDRESS``, else a local one.

    A local Ray starts without the dashboard (it costs seconds and ~900 MB).
    """
    import ray

    if ray.is_initialized():
        return ray
    address = options.get("address") or os.environ.get("RAY_ADDRESS")
    kwargs: dict[str, Any] = {"address": address, "ignore_reinit_error": True, "log_to_driver": True}
    if not address:  # "local": start one, never join a Ray some other program started on this machine
        keep_token_private()
        kwargs.update(address="local", include_dashboard=False)
        if options.get("num_cpus") is not None:
            kwargs["num_cpus"] = options["num_cpus"]
    ray.init(**kwargs)
    return ray


def keep_token_private(home: Path | None = None) -> None:
    """Before this library starts a local Ray: Ray's token file, readable by this user only.

    Ray (>= 2.59) turns token authentication on for a local cluster (unless
    ``RAY_AUTH_MODE`` says otherwise) and, without a token, writes a new one to
    ``~/.ray/auth_token`` with the process's umask, often readable by every
    user: whoever reads it may submit work to the cluster.  The file is made
    here first (0600), or narrowed to 0600 when it is this user's.
    """
    if os.environ.get("RAY_AUTH_MODE", "token").lower() != "token":
        return
    if os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH"):
        return  # the user's own token, kept where the user keeps it
    path = (home or Path.home()) / ".ray" / "auth_token"
    try:
        path.parent.mkdir(mode=0o700, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        with contextlib.suppress(OSError):
            if path.stat().st_uid == os.getuid() and path.stat().st_mode & 0o077:
                path.chmod(0o600)
        return
    except OSError:  # no home to write to: Ray says so itself
        return
    with os.fdopen(fd, "w") as out:
        out.write(secrets.token_hex(32))  # as Ray makes its tokens


def session_key(ray: Any) -> str:
    """Which Ray session this process is connected to: job id and driver node (job ids repeat in a fresh Ray)."""
    context = ray.get_runtime_context()
    return f"{context.get_job_id()}@{context.get_node_id()}"


def in_session(ray: Any, key: str) -> bool:
    """Whether this process is still connected to the Ray session ``key`` names.

    Asks nothing of Ray when it is not initialised: a Ray call then would start a new local Ray
    (Ray's auto-init) behind the user's back, and a user's own ``ray.init`` would then fail.
    """
    if not ray.is_initialized():
        return False
    try:
        return session_key(ray) == key
    except Exception:  # noqa: BLE001 - shutting down as we ask
        return False


def ip_sort_key(ip: str) -> tuple[int, int, str]:
    """Order node IPs as numbers (10.0.0.9 before 10.0.0.10), names last."""
    try:
        addr = ipaddress.ip_address(ip)
    except ValueError:
        return (2, 0, ip)
    return (addr.version, int(addr), ip)


def cuda_device_index(gpu_ids: list[Any], visible: str | None) -> int | None:
    """Index, in this process's CUDA numbering, of the first GPU Ray assigned (``None``: no GPU).

    Ray usually narrows ``CUDA_VISIBLE_DEVICES`` to the actor's GPUs; else the id is the index.
    """
    if not gpu_ids:
        return None
    first = str(gpu_ids[0])
    if visible:
        listed = [v.strip() for v in visible.split(",") if v.strip()]
        if first in listed:
            return listed.index(first)
    try:
        return int(first)
    except ValueError:
        return 0
