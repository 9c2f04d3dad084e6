"""Two-process groups on a store, and what waits on their sends: the pieces every bridge is built from.

A gloo group listens on loopback only when asked (one machine), else on the
address the hostname resolves to (several nodes); NCCL for CUDA tensors.
"""

from __future__ import annotations

import queue
import threading
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from .._spi import LOOPBACK

#: Queued after the last send: the reaper thread exits when it reaches it.
_STOP: Any = object()


class SendReaper:
    """Waits on posted sends in a daemon thread (a gloo send completes only through ``wait()``), then lets go."""

    def __init__(self, name: str) -> None:
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._outstanding = 0
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def add(self, works: list[Any], keep: Any) -> None:
        """Hold ``keep`` (the tensors being sent) until every work in ``works`` is done."""
        if not works:
            return
        with self._cond:
            self._outstanding += 1
        self._queue.put((works, keep))

    def drain(self, timeout: float) -> bool:
        """Wait until every send so far has completed (or failed); False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: self._outstanding == 0, timeout)

    def close(self, timeout: float = 1.0) -> None:
        """Stop the reaper thread once the sends queued so far are done (idempotent)."""
        if self._thread.is_alive():
            self._queue.put(_STOP)
            self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            works, keep = item
            for work in works:
                try:
                    work.wait()
                except Exception:  # noqa: BLE001, S112 - the peer is gone; its death is reported elsewhere
                    continue
            del works, keep
            with self._cond:
                self._outstanding -= 1
                self._cond.notify_all()


def gloo_group(store: dist.Store, rank: int, size: int, timeout: timedelta, loopback: bool) -> dist.ProcessGroupGloo:
    """The executor's gloo group; with ``loopback`` (a self-started world, one machine) it listens on 127.0.0.1 only.

    Without a device gloo binds to the address the hostname resolves to (right under torchrun: several nodes).
    """
    if not loopback:
        return dist.ProcessGroupGloo(store, rank, size, timeout)
    options = dist.ProcessGroupGloo._Options()  # type: ignore[attr-defined]
    options._timeout = timeout
    options._devices = [dist.ProcessGroupGloo.create_device(hostname=LOOPBACK)]
    options._threads = 2  # what the timeout-only constructor uses for one device
    return dist.ProcessGroupGloo(store, rank, size, options)


def nccl_group(store: dist.Store, rank: int, size: int, timeout: timedelta) -> Any:
    options = dist.ProcessGroupNCCL.Options()
    options._timeout = timeout
    return dist.ProcessGroupNCCL(store, rank, size, options)


def pair_group(store: dist.Store, rank: int, cuda: bool, timeout: float, loopback: bool) -> Any:
    """One end of a two-rank bridge on ``store`` (rank 0 sends, rank 1 receives): NCCL for CUDA, else gloo."""
    bound = timedelta(seconds=timeout)
    if cuda:
        return nccl_group(store, rank, 2, bound)
    return gloo_group(store, rank, 2, bound, loopback=loopback)


def peer_error(exc: BaseException) -> str:
    """The last line of a failed transfer's error, without gloo's source location."""
    text = (str(exc).strip().splitlines() or [type(exc).__name__])[-1]
    return text.split("] ", 1)[-1]
