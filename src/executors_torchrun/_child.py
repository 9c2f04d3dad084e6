"""A self-started rank's first moments, before anything heavy is imported.

The driver writes its lane secret (one hex line) on the child's stdin and
keeps the pipe open; the child exits when the pipe closes, however the
driver ends.  The watch starts here, ahead of ``import torch.distributed``
(seconds on a busy machine), so a child outlives a killed driver by a moment.
Only the standard library is imported by this module.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
import threading
import traceback

#: Makes a self-started process print every thread's stack on stderr (relayed with its label): the driver
#: sends it to processes that never connected, before it raises the timeout.  A real-time signal, which
#: torch, torchrun and SLURM leave alone.
STACKS_SIGNAL: int | None = signal.SIGRTMIN + 4 if hasattr(signal, "SIGRTMIN") else None


def main() -> None:
    """Entry point of a self-started rank process (``_spawn.spawn_process``)."""
    if STACKS_SIGNAL is not None:
        faulthandler.register(STACKS_SIGNAL, all_threads=True)
    # A terminal's Ctrl-C reaches this process too (same process group): it is the driver's to
    # handle; a rank that died of it would turn the driver's KeyboardInterrupt into a dead rank.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    line = sys.stdin.buffer.readline()
    if not line.endswith(b"\n"):  # the driver ended before handing the secret over
        os._exit(0)
    threading.Thread(target=_watch_driver, name="dispatchcore-driver-watch", daemon=True).start()
    try:
        from ._spawn import child_main

        child_main(bytes.fromhex(line.decode()))
    except BaseException:  # noqa: BLE001 - said on stderr (relayed with the rank's label), then a plain exit
        traceback.print_exc()
        sys.stderr.flush()
        # Never the interpreter's own exit: its finalisers can wait forever in torch's destructors (a gloo
        # group whose peer was killed), leaving a live process that never serves and is never seen dead.
        os._exit(1)


def _watch_driver() -> None:
    """Exit when the pipe from the driver closes (the driver stopped us or died)."""
    try:
        sys.stdin.buffer.read()
    finally:
        os._exit(0)
