"""A third-party executor can replace dead ranks: ``replace_ranks`` through the public contract."""

from __future__ import annotations

import os
import signal

import pytest

from dispatchcore import Dispatch, MembershipChange, Worker, WorkerDiedError, WorkerGroup, register

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


class Counter(Worker):
    def __init__(self) -> None:
        self.seen: list[object] = []

    @register(Dispatch.ONE_TO_ALL)
    def pid(self) -> int:
        return os.getpid()

    @register(Dispatch.ONE_TO_ALL, setup=True)
    def configure(self, value: str) -> None:
        self.seen.append(value)

    @register(Dispatch.ONE_TO_ALL, retry=True)
    def seen_so_far(self) -> list[object]:
        return list(self.seen)

    def on_membership_change(self, change: MembershipChange) -> None:
        self.seen.append(("rejoined", change.is_new(self.rank)))


def test_replace_rank_on_the_multiprocess_plugin() -> None:
    with WorkerGroup(Counter, 2, backend="multiprocess", death_timeout=5) as wg:
        wg.configure("cfg")
        os.kill(wg.pid()[1], signal.SIGKILL)
        with pytest.raises(WorkerDiedError):
            wg.seen_so_far()
        change = wg.replace_rank(1)
        assert wg.seen_so_far() == [["cfg", ("rejoined", False)], ["cfg", ("rejoined", True)]]
        assert change.env["MASTER_PORT"] and change.replaced == (1,)
