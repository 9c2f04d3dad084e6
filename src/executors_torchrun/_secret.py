"""The lane secret every process of one torchrun launch shares, found where another user cannot read it.

torchrun's agent starts every process, so no process can hand the others a
secret on a pipe.  In order: the variable ``DISPATCHCORE_SECRET`` (hex, at
least 16 bytes; the user sets it for every node of a multi-node launch, and
it is required there), else, on one node, a file of 32 random bytes that
only this uid can read, in a directory only this uid can enter, named for
this launch (run id, the elastic agent's pid, restart count).  The first
process to look creates it; the driver removes it at exit.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
import tempfile
import time
from pathlib import Path

from dispatchcore import DispatchRuntimeError

from . import _env

SECRET_ENV = "DISPATCHCORE_SECRET"
_FIX = (
    f"set {SECRET_ENV} to the same random hex string on every node before torchrun, e.g. "
    f'`export {SECRET_ENV}=$(python -c "import secrets; print(secrets.token_hex(32))")`'
)


def launch_secret(timeout: float = 60.0) -> bytes:
    """This launch's secret (see the module docstring); raises with the fix when none can be had."""
    text = os.environ.get(SECRET_ENV)
    if text:
        try:
            secret = bytes.fromhex(text.strip())
        except ValueError:
            raise DispatchRuntimeError(f"{SECRET_ENV} is not a hex string; {_FIX}") from None
        if len(secret) < 16:
            raise DispatchRuntimeError(f"{SECRET_ENV} holds {len(secret)} bytes, fewer than 16; {_FIX}")
        return secret
    local, world = _env.launch_var("LOCAL_WORLD_SIZE", ""), _env.launch_var("WORLD_SIZE")
    if local and int(local) != int(world):
        raise DispatchRuntimeError(
            f"this torchrun launch spans several nodes ({local} of {world} processes here) and "
            f"{SECRET_ENV} is not set, so its processes share no secret to prove they are one job; {_FIX}"
        )
    return _shared_file(timeout)


def secret_path() -> Path:
    """The file that holds this launch's secret on this node (in a directory only this uid may enter)."""
    base = os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()
    folder = Path(base) / f"dispatchcore-{os.getuid()}"
    with contextlib.suppress(FileExistsError):
        folder.mkdir(mode=0o700)
    _check_private(folder, is_dir=True)
    name = f"{_env.run_id()}.{os.getppid()}".replace(os.sep, "_")
    return folder / f"launch-{name}.secret"


def remove_secret_file() -> None:
    """Remove this launch's secret file (the driver, at exit); nothing when the secret came from the variable."""
    if not os.environ.get(SECRET_ENV):
        with contextlib.suppress(OSError, DispatchRuntimeError):
            secret_path().unlink()


def _shared_file(timeout: float) -> bytes:
    path = secret_path()
    fresh = path.with_name(f"{path.name}.{os.getpid()}.new")
    fd = os.open(fresh, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, secrets.token_bytes(32))
    finally:
        os.close(fd)
    try:
        os.link(fresh, path)  # the first process's bytes win; the others read them
    except FileExistsError:
        pass
    finally:
        fresh.unlink()
    deadline = time.monotonic() + timeout
    while True:
        _check_private(path, is_dir=False)
        data = path.read_bytes()
        if len(data) == 32:
            return data
        if time.monotonic() > deadline:
            raise DispatchRuntimeError(f"the launch's secret file {path} holds {len(data)} bytes, not 32; {_FIX}")
        time.sleep(0.05)


def _check_private(path: Path, *, is_dir: bool) -> None:
    """Refuse a path another user owns or can read (a stranger may have made it first)."""
    try:
        info = os.lstat(path)
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            raise DispatchRuntimeError(f"the launch's secret {path} vanished; {_FIX}") from exc
        raise
    kind_ok = stat.S_ISDIR(info.st_mode) if is_dir else stat.S_ISREG(info.st_mode)
    if not kind_ok or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise DispatchRuntimeError(
            f"{path} is not private to this user (owner uid {info.st_uid}, mode {oct(info.st_mode & 0o777)}): "
            f"another user may read or have planted it; remove it, or {_FIX}"
        )
