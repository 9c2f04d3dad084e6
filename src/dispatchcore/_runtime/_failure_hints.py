"""Fixes appended to a worker's error when its message is one a newcomer cannot act on alone.

A worker's exception is the user's own; the library adds a hint only where it knows the cause better than
the message does (a torch call that reads an environment the backend does not give, say).
"""

from __future__ import annotations

from .._base import WorkerDiedError, WorkerError

#: (text in the remote message, the hint to append).
_HINTS = (
    (
        "expected, but not set",
        "torch.distributed.init_process_group() reads RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT from the "
        "environment; the 'local' backend's ranks are threads of the driver process, which has none of them "
        "(and a process holds one default process group). Run the group with WorkerGroup(..., "
        "backend='torchrun') (it starts a process per rank itself, no launcher needed) or backend='ray', whose "
        "ranks have that environment",
    ),
)


def with_hint(error: WorkerError | WorkerDiedError) -> WorkerError | WorkerDiedError:
    """``error``, its message followed by the fix when it is a known dead end."""
    if isinstance(error, WorkerError):
        for needle, hint in _HINTS:
            if needle in error.exc_message and hint not in error.exc_message:
                error.exc_message = f"{error.exc_message}\nhint: {hint}"
                break
    return error
