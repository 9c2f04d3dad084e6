"""Workers that meet in a collective: a gloo ``all_reduce`` across processes, a barrier across threads.

Process backends (torchrun, ray, multiprocess) join a gloo world of their
own in a setup call, from the ``MASTER_ADDR``/``MASTER_PORT`` the executor
put in ``os.environ`` (as ``dispatchcore.demo.collective`` does), with a
gloo timeout of :data:`GLOO_TIMEOUT_S`: far past any test's timeout, so a
test passes only when the driver does not wait for the collective to give
up.  Local ranks are threads of one process, where torch.distributed cannot
have several ranks: they meet at a ``threading.Barrier`` without a timeout
(:func:`release_barriers` lets a stuck thread go at the end of a test).

Ranks in other processes cannot import ``tests/``: the module travels by
value (see ``_workers``).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from datetime import timedelta
from typing import Any

import cloudpickle
import torch
import torch.distributed as dist

from dispatchcore import Dispatch, MembershipChange, Worker, register

#: gloo's own bound on a collective: ten minutes, far past the tests' timeouts.
GLOO_TIMEOUT_S = 600.0
#: How long the raising rank lets the others get from their signal into the collective.
ENTER_S = 0.1
#: Longer than any test's timeout.
FOREVER_S = 3600.0


class _ThreadWorld:
    """The local ranks of one group: a barrier without a timeout and a slot per rank."""

    def __init__(self, parties: int) -> None:
        self.barrier = threading.Barrier(parties)
        self.slots = [0.0] * parties

    def sum(self, rank: int, value: float) -> float:
        self.slots[rank] = value
        self.barrier.wait()  # no timeout: only the other ranks, or an abort, end it
        total = sum(self.slots)
        self.barrier.wait()  # nobody overwrites a slot before every rank has read
        return total


class _ThreadWorlds:
    """The thread worlds of this process, by key; pickles as an empty one (each process has its own)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_key: dict[str, _ThreadWorld] = {}

    def get(self, key: str, parties: int) -> _ThreadWorld:
        with self._lock:
            found = self._by_key.get(key)
            if found is None:
                found = self._by_key[key] = _ThreadWorld(parties)
            return found

    def release(self) -> None:
        with self._lock:
            worlds = list(self._by_key.values())
            self._by_key.clear()
        for world in worlds:
            world.barrier.abort()

    def __reduce__(self) -> tuple[Any, ...]:
        return (_ThreadWorlds, ())


_THREAD_WORLDS = _ThreadWorlds()


def release_barriers() -> None:
    """Break every barrier of this process: a local rank stuck at one leaves it (``BrokenBarrierError``)."""
    _THREAD_WORLDS.release()


class CollectiveWorker(Worker):
    """Ranks that all-reduce together; one may raise (or be killed) while the other waits in the collective."""

    def __init__(self) -> None:
        self.mode = "none"
        self.key = ""

    @register(Dispatch.ONE_TO_ALL, setup=True)
    def join(self, mode: str, key: str) -> None:
        """Join the group's collective: ``"gloo"`` (a process group from the environment) or ``"thread"``."""
        self.mode, self.key = mode, key
        if mode == "gloo":
            _init_gloo()

    @register(Dispatch.ONE_TO_ALL)
    def pid(self) -> int:
        return os.getpid()

    @register(Dispatch.ONE_TO_ALL, retry=True)
    def ping(self) -> int:
        return self.rank

    @register(Dispatch.ONE_TO_ALL, retry=True)
    def total(self) -> float:
        """The sum of ``rank + 1`` over the ranks, through the collective (retry-safe: it changes nothing)."""
        return self._reduce(float(self.rank + 1))

    @register(Dispatch.ONE_TO_ALL)
    def raise_before_total(self, rank: int, ready: str) -> float:
        """Rank ``rank`` raises once the others are in the collective (they touch the file ``ready`` first).

        The ranks share a machine, so a file is their signal.  The message
        carries the moment of the raise (``time.monotonic()``, one clock for
        every process of a machine), so the driver can measure from it.
        """
        if self.rank == rank:
            deadline = time.monotonic() + FOREVER_S
            while not os.path.exists(ready) and time.monotonic() < deadline:
                time.sleep(0.01)
            time.sleep(ENTER_S)
            raise ValueError(f"planted before the collective on rank {rank}, at t={time.monotonic():.6f}")
        with open(ready, "a"):
            pass
        return self._reduce(float(self.rank + 1))

    @register(Dispatch.ONE_TO_ALL)
    def sleep_long(self, seconds: float) -> int:
        """Block in C (``time.sleep``) with the cancel's signal masked: no interrupt asked of the rank reaches it.

        Unmasked, a self-started torchrun rank would leave the sleep 1 s after a cancel (a signal).
        """
        from dispatchcore.executor import INTERRUPT_SIGNAL

        masked = signal.pthread_sigmask(signal.SIG_BLOCK, {INTERRUPT_SIGNAL} if INTERRUPT_SIGNAL else set())
        try:
            time.sleep(seconds)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, masked)
        return self.rank

    @register(Dispatch.ONE_TO_ALL)
    def total_after(self, rank: int, seconds: float) -> float:
        """Rank ``rank`` sleeps ``seconds`` before joining the collective the others already wait in."""
        if self.rank == rank:
            time.sleep(seconds)
        return self._reduce(float(self.rank + 1))

    def on_membership_change(self, change: MembershipChange) -> None:
        """A survivor leaves its old gloo world and joins the rebuilt one (a new rank joined it in ``join``)."""
        if self.mode == "gloo" and not change.is_new(self.rank):
            if dist.is_initialized():
                dist.destroy_process_group()
            _init_gloo()
        elif self.mode == "thread":
            raise RuntimeError("local ranks are never replaced")

    def _reduce(self, value: float) -> float:
        if self.mode == "gloo":
            tensor = torch.tensor([value])
            dist.all_reduce(tensor)
            return float(tensor.item())
        return _THREAD_WORLDS.get(self.key, self.world_size).sum(self.rank, value)


def _init_gloo() -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=GLOO_TIMEOUT_S))


# Ranks in other processes get this module's classes by value (see the module docstring).
cloudpickle.register_pickle_by_value(sys.modules[__name__])
