"""``MultiprocessExecutor``: one spawned process per rank on the core's lane.

Written only against the public executor contract (:mod:`dispatchcore.executor`).
Everything between the driver and its ranks (calls, answers, pings,
cancels, stacks, liveness, the call envelope) is the core's
:class:`~dispatchcore.executor.LaneExecutor`.  What is specific to this
backend:

* how ranks start: ``multiprocessing`` processes (start method ``spawn``),
  each given torchrun's variables from :func:`rank_environment` and the
  lane's address;
* how death is seen, besides the lane's own rule: a rank process that
  exited (:meth:`MultiprocessExecutor.rank_dead`, its exit code);
* how ranks stop: they leave when the lane closes; the stragglers are
  terminated, then killed, and reaped.
"""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Sequence
from multiprocessing.connection import wait
from multiprocessing.process import BaseProcess
from typing import Any

from dispatchcore import DispatchError
from dispatchcore.executor import (
    COLLECTIVE_STORE_ENV,
    LOOPBACK,
    GroupSpec,
    LaneAddress,
    LaneExecutor,
    StoreCollective,
    check_options,
    free_port,
    lane_secret,
    rank_environment,
)

from ._rank import rank_main

_DEFAULTS: dict[str, Any] = {"start_timeout": 300.0, "env": None}
#: Seconds a rank gets to leave after each of: the lane's end, SIGTERM, SIGKILL.
STOP_GRACE_S = 1.0


class MultiprocessExecutor(LaneExecutor):
    """Backend ``"multiprocess"``: one spawned process per rank on this machine.

    Options: ``start_timeout`` (seconds to wait for every worker's
    ``__init__``, default 300), ``env`` (extra environment variables for
    every rank).
    """

    name = "multiprocess"
    requires = ("cloudpickle",)  # driver-defined classes and lambdas travel by value

    def __init__(self, spec: GroupSpec) -> None:
        options = check_options(self.name, spec.options, _DEFAULTS)
        super().__init__(spec)  # refuses a worker class that cannot be pickled, before any process starts
        self._timeout = float(options["start_timeout"])
        self._env = options["env"]
        self._processes: dict[int, BaseProcess] = {}
        #: Processes of replaced ranks (reaped at shutdown with the rest).
        self._retired: list[BaseProcess] = []
        try:
            #: dispatchcore.collective's store: held here, so it outlives a replaced rank.
            self._collective: tuple[Any, str] | None = StoreCollective.serve(LOOPBACK)
            self._port = free_port(LOOPBACK)
            self.open_ranks(range(spec.world_size), self._timeout)
        except BaseException:
            self.shutdown()
            raise

    def launch_ranks(self, ranks: Sequence[int], address: LaneAddress) -> None:
        ctx = multiprocessing.get_context("spawn")
        size = self.spec.world_size
        for rank in ranks:
            env = rank_environment(rank, size, master_addr=LOOPBACK, master_port=self._port, extra=self._env)
            if self._collective is not None:
                env[COLLECTIVE_STORE_ENV] = self._collective[1]
            name = f"dispatchcore-{self.spec.name}-rank{rank}"
            # the lane secret rides the spawn pipe with the other arguments: never argv, a store or a file
            process = ctx.Process(target=rank_main, args=(address.encode(), lane_secret(), rank, env), name=name)
            process.start()
            self._processes[rank] = process

    def rank_dead(self, rank: int) -> str | None:
        process = self._processes.get(rank)
        try:
            code = None if process is None else process.exitcode
        except ValueError:  # closed at shutdown
            return "the group was shut down"
        return None if code is None else f"its process exited with code {code}"

    def replace_ranks(self, ranks: Sequence[int]) -> dict[str, str]:
        """A new process for each of ``ranks`` (the old one killed first), with a fresh rendezvous port."""
        if self.closed:
            raise DispatchError("this multiprocess group is shut down")
        self._port = free_port(LOOPBACK)
        for rank in ranks:
            old = self._processes.pop(rank)
            if old.is_alive():
                old.kill()
            self._retired.append(old)
        self.open_ranks(ranks, self._timeout)
        return {"MASTER_ADDR": LOOPBACK, "MASTER_PORT": str(self._port)}

    def stop_ranks(self) -> None:
        """The ranks leave as their lane closes; then SIGTERM, then SIGKILL, each after a grace."""
        self._collective = None
        everyone = [*self._processes.values(), *self._retired]
        for stop in (None, "terminate", "kill"):
            for process in everyone:
                if stop is not None and process.is_alive():
                    getattr(process, stop)()
            if _all_exited(everyone, STOP_GRACE_S):
                break
        for process in everyone:
            process.join(STOP_GRACE_S)
            if process.exitcode is not None:
                process.close()


def _all_exited(processes: list[BaseProcess], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    sentinels = [process.sentinel for process in processes if process.exitcode is None]
    while sentinels and (left := deadline - time.monotonic()) > 0:
        for ready in wait(sentinels, left):
            sentinels.remove(ready)  # type: ignore[arg-type]
    return not sentinels
