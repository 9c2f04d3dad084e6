"""Workers that plant faults: raise, die, hang, run slow, on chosen ranks.

Ray actors and self-started ranks cannot import ``tests/`` by name, so this
module is registered with cloudpickle to travel by value (as a class defined
in a driver script does); the local backend uses it in place.  A hang waits
on :data:`RELEASE` so a local rank's thread, which nothing can stop, ends
when the test lets it go.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from typing import Any

import cloudpickle
import torch

from dispatchcore import DataProto, Dispatch, Worker, register

#: Longer than any test's timeout: a call that waits this out fails its test.
FOREVER_S = 3600.0


class _ProcessEvent:
    """A ``threading.Event`` that pickles as a fresh one: each process has its own."""

    def __init__(self) -> None:
        self._event = threading.Event()

    def set(self) -> None:
        self._event.set()

    def clear(self) -> None:
        self._event.clear()

    def wait(self, seconds: float) -> bool:
        return self._event.wait(seconds)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_ProcessEvent, ())


#: Set by a test to end every hang in this process (local ranks only).
RELEASE = _ProcessEvent()


def _chosen(rank: int, ranks: Any) -> bool:
    """Whether ``rank`` is planted: ``ranks`` is ``None`` (every rank), an int or a collection."""
    if ranks is None:
        return True
    if isinstance(ranks, int):
        return rank == ranks
    return rank in ranks


class PlantedError(ValueError):
    """The exception a planted raise throws (a user-defined type: its name must reach the driver)."""


class FaultWorker(Worker):
    """One method per fault; each takes the rank(s) it hits, the others behave."""

    def __init__(self) -> None:
        self.calls = 0

    @register(Dispatch.ONE_TO_ALL)
    def ping(self) -> int:
        self.calls += 1
        return self.rank

    @register(Dispatch.ONE_TO_ALL)
    def counter(self) -> int:
        """How many counted calls (``ping``, ``raise_*``) this worker has served."""
        return self.calls

    @register(Dispatch.ONE_TO_ALL)
    def pid(self) -> int:
        return os.getpid()

    @register(Dispatch.ONE_TO_ALL)
    def raise_on(self, ranks: Any = None) -> int:
        self.calls += 1
        if _chosen(self.rank, ranks):
            raise PlantedError(f"planted failure on rank {self.rank}")
        return self.rank

    @register(Dispatch.ONE_TO_ALL)
    def raise_after(self, calls: int) -> int:
        """Answer ``calls`` times, then raise on every later call (a fault that appears late)."""
        self.calls += 1
        if self.calls > calls:
            raise PlantedError(f"planted failure on call {self.calls} of rank {self.rank}")
        return self.calls

    @register(Dispatch.ONE_TO_ALL)
    def die_on(self, ranks: Any, how: str = "exit", after: float = 0.0, others: float = FOREVER_S) -> int:
        """Planted ranks die ``after`` s into the call (``os._exit`` or SIGKILL); the others run ``others`` s."""
        if _chosen(self.rank, ranks):
            time.sleep(after)
            if how == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            os._exit(3)
        _wait(others)
        return self.rank

    @register(Dispatch.ONE_TO_ALL)
    def exit_later(self, ranks: Any, after: float) -> int:
        """Return now; planted ranks' processes exit ``after`` s later, while idle."""
        if _chosen(self.rank, ranks):
            threading.Timer(after, os._exit, args=(3,)).start()
        return os.getpid()

    @register(Dispatch.ONE_TO_ALL)
    def sleep_on(self, ranks: Any, seconds: float) -> int:
        """Planted ranks take ``seconds``; the others answer at once."""
        if _chosen(self.rank, ranks):
            _wait(seconds)
        return self.rank

    @register(Dispatch.ONE_TO_ALL)
    def hang(self, ranks: Any = None) -> int:
        """Planted ranks never answer (until :data:`RELEASE`, in this process)."""
        if _chosen(self.rank, ranks):
            _wait(FOREVER_S)
        return self.rank

    @register(Dispatch.DP_COMPUTE)
    def tagged(self, token: Any) -> tuple[int, Any]:
        """``(rank, token)``: which caller's call this answer belongs to."""
        time.sleep(0.001)
        return self.rank, token

    @register(Dispatch.DP_COMPUTE_PROTO)
    def plus_rank(self, data: DataProto) -> DataProto:
        """Each row's ``x`` plus 1000 times the rank that processed it."""
        return DataProto.from_dict(
            {"x": data.batch["x"] + 1000 * self.rank, "rank": torch.full((len(data),), self.rank)}
        )


def _wait(seconds: float) -> None:
    RELEASE.wait(seconds)


# Ranks in other processes get this module's classes by value (see the module docstring).
cloudpickle.register_pickle_by_value(sys.modules[__name__])
