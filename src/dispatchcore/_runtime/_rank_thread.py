"""Running a rank in this process: one long-lived thread, which copies its own inputs (the driver pays none)."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

from .._spi import PLAIN, Instructions
from ._isolation import ATOMS, isolated_copy
from ._worker_host import RemoteFailure, WorkerHost


def run_isolated(
    host: WorkerHost,
    method: str,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    isolate_inputs: bool = True,
    isolate_result: bool = True,
    instructions: Instructions = PLAIN,
) -> tuple[bool, Any]:
    """Run ``method`` on ``host`` as a remote rank would see it (private copies in and out); never raises."""
    if isolate_inputs and (args or kwargs):
        try:
            args = tuple(isolated_copy(a) for a in args)
            kwargs = {k: isolated_copy(v) for k, v in kwargs.items()}
        except BaseException as exc:  # noqa: BLE001 - reported to the driver
            return False, RemoteFailure.unpicklable(
                host.rank, method, "arguments", exc, in_process=True, value=(args, kwargs)
            )
    ok, value = host.run(method, args, kwargs, instructions)
    if ok and isolate_result and type(value) not in ATOMS:
        try:
            value = isolated_copy(value)
        except Exception as exc:  # noqa: BLE001
            return False, RemoteFailure.unpicklable(host.rank, method, "result", exc, in_process=True, value=value)
    return ok, value


class RankThread:
    """One rank's daemon thread, running the tasks put on its queue in order."""

    def __init__(self, host: WorkerHost, name: str) -> None:
        self.host = host
        self._tasks: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self.thread.start()

    def put(self, task: Callable[[], None]) -> None:
        """Run ``task`` on this rank's thread after the ones already queued."""
        self._tasks.put(task)

    def is_alive(self) -> bool:
        return self.thread.is_alive()

    def request_stop(self) -> None:
        """Let the thread finish what is queued, then exit."""
        self._tasks.put(None)

    def join(self, timeout: float) -> None:
        """Wait up to ``timeout`` for the thread to exit (it is a daemon: never required)."""
        if self.thread is not threading.current_thread() and self.thread.ident is not None:
            self.thread.join(max(0.0, timeout))

    def _serve(self) -> None:
        while True:
            task = self._tasks.get()
            if task is None:
                break
            task()
        self.host.close()
