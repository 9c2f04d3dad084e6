"""The rank side: a spawned process that serves the core's lane until its driver goes.

The process takes its rank variables, makes its ``LOCAL_RANK`` CUDA device
current (docs/design.md, "Invariants"), and hands the rest to
:class:`~dispatchcore.executor.LaneRank`: the worker is built and every call
runs on this process's main thread; pings, cancels and stacks are answered
beside it.  When the driver's lane ends (shutdown, or the driver died and
the kernel closed its sockets) the process leaves at once.
"""

from __future__ import annotations

import os
import signal
import sys

import torch

from dispatchcore.executor import LaneRank, StoreCollective, WorkerHost


def rank_main(address: str, secret: bytes, rank: int, env: dict[str, str]) -> None:
    """Entry point of a rank process (the target ``multiprocessing`` spawns); ``secret`` is the driver's lane secret."""
    os.environ.update(env)  # this process's own environment; the driver's stays untouched
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the driver's to handle
    if torch.cuda.is_available():
        torch.cuda.set_device(int(env["LOCAL_RANK"]) % torch.cuda.device_count())
    LaneRank(rank, prepare=_prepare, on_driver_gone=_leave).serve(address, secret=secret)
    _leave()


def _prepare(host: WorkerHost) -> None:
    host.collective = StoreCollective.from_environment("multiprocess", os.environ)


def _leave() -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip tearing down torch at interpreter exit (about a second): nothing is left to do
