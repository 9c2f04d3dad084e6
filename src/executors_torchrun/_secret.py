"""The lane secret every process of one torchrun launch shares (docs/security.md, "torchrun").

The launcher's agent starts the processes, so no driver can hand them a
secret on a pipe: each finds the same one.  ``DISPATCHCORE_SECRET`` (hex, set
by the user on every node) wins, and is required when the launch spans
several nodes.  On one node the first process to look creates a 0600 file in
a 0700 directory of this user's (``$XDG_RUNTIME_DIR/dispatchcore`` or
``~/.cache/dispatchcore``), named for the launch (its run id, the agent's pid
and the restart), and the others read it; the driver removes it once every
process is up.  Anything else is refused with the fix named.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import stat
from pathlib import Path

from dispatchcore import DispatchRuntimeError

from ._env import spans_nodes

#: The variable a multi-node launch's secret comes from (hex, the same on every node).
SECRET_ENV = "DISPATCHCORE_SECRET"
_MAKE = "export DISPATCHCORE_SECRET=$(python -c 'import secrets; print(secrets.token_hex(32))')"


def launch_secret() -> bytes:
    """This launch's shared secret (module doc); raises naming the fix when none can be had."""
    text = os.environ.get(SECRET_ENV)
    if text is not None:
        return _from_hex(text)
    if spans_nodes():
        raise DispatchRuntimeError(
            f"this torchrun launch spans several nodes, so its processes need a shared lane secret: set "
            f"{SECRET_ENV} to the same random hex string on every node before torchrun ({_MAKE})"
        )
    directory = _directory()
    fd = _open_directory(directory)
    try:
        return _read_or_create(fd, directory)
    finally:
        os.close(fd)


def forget_launch_secret() -> None:
    """Remove this launch's secret file (the driver, once every process has read it); no-op without one."""
    if os.environ.get(SECRET_ENV) is not None or spans_nodes():
        return
    with contextlib.suppress(OSError):
        os.unlink(_directory() / _file_name())


def _from_hex(text: str) -> bytes:
    try:
        secret = bytes.fromhex(text.strip())
    except ValueError:
        secret = b""
    if len(secret) < 16:
        raise DispatchRuntimeError(
            f"{SECRET_ENV} must be a random hex string of at least 32 digits (16 bytes), the same on every node; "
            f"make one with: {_MAKE}"
        )
    return secret


def _directory() -> Path:
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    base = Path(runtime) if runtime and os.path.isabs(runtime) and os.path.isdir(runtime) else Path.home() / ".cache"
    return base / "dispatchcore"


def _file_name() -> str:
    """Unique to this launch on this machine: the run id, the agent's pid (every local rank's parent), the restart."""
    launch = "\0".join(
        (
            os.environ.get("TORCHELASTIC_RUN_ID", "none"),
            str(os.getppid()),
            os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"),
        )
    )
    return f"launch-{hashlib.sha256(launch.encode()).hexdigest()[:32]}.secret"


def _open_directory(directory: Path) -> int:
    """The secrets directory, made 0700 if missing, refused unless it is this user's and closed to others."""
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as exc:
        raise DispatchRuntimeError(
            f"cannot open {directory} for this launch's lane secret ({exc}); {_or_env()}"
        ) from exc
    info = os.fstat(fd)
    if info.st_uid != os.getuid() or info.st_mode & 0o077:
        os.close(fd)
        raise DispatchRuntimeError(
            f"{directory} holds this launch's lane secret but is owned by uid {info.st_uid} with mode "
            f"{stat.S_IMODE(info.st_mode):o} (it must be yours, uid {os.getuid()}, and mode 700): "
            f"`chmod 700 {directory}`, or {_or_env()}"
        )
    return fd


def _read_or_create(directory_fd: int, directory: Path) -> bytes:
    """Create the file atomically (a temporary file linked into place), or read the one another process made."""
    name = _file_name()
    temporary = f".{name}.{secrets.token_hex(8)}"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=directory_fd)
    try:
        with os.fdopen(fd, "w") as out:
            out.write(secrets.token_hex(32))
        with contextlib.suppress(FileExistsError):  # another local rank was first: read its secret
            os.link(temporary, name, src_dir_fd=directory_fd, dst_dir_fd=directory_fd, follow_symlinks=False)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(temporary, dir_fd=directory_fd)
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=directory_fd)
    with os.fdopen(fd) as held:
        info = os.fstat(held.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
            raise DispatchRuntimeError(
                f"{directory / name} is not a file only you can read (uid {info.st_uid}, mode "
                f"{stat.S_IMODE(info.st_mode):o}): remove it, or {_or_env()}"
            )
        return _from_hex(held.read())


def _or_env() -> str:
    return f"set {SECRET_ENV} for the launch ({_MAKE})"
