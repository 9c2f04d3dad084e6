"""Worker 0 under torchrun: hosted in the driver process, on its own thread.

The driver must stay free while worker 0 computes (to time out, to issue
``blocking=False`` calls, to read other ranks' results), so worker 0 gets a
long-lived daemon thread, like a rank of the local backend; the thread has
the rank's CUDA device current.  Isolation is kept as the local backend
keeps it: each argument pickled once on the driver, unpickled per call
into private memory.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable

import torch

from dispatchcore import WorkerHost


class LocalRank:
    """One worker on one daemon thread; tasks run in submission order."""

    def __init__(self, host: WorkerHost, name: str) -> None:
        self.host = host
        self._tasks: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self.thread.start()

    def put(self, task: Callable[[], None]) -> None:
        self._tasks.put(task)

    def _serve(self) -> None:
        if torch.cuda.is_available() and "LOCAL_RANK" in os.environ:
            torch.cuda.set_device(int(os.environ["LOCAL_RANK"]) % torch.cuda.device_count())
        while True:
            task = self._tasks.get()
            if task is None:
                break
            task()
        self.host.close()

    def stop(self, wait: float) -> None:
        self._tasks.put(None)
        if self.thread is not threading.current_thread():
            self.thread.join(wait)
