"""A torchrun rank whose lane link outlives it (a forked child holds the socket) is still reported dead.

The lane itself is tested once, in ``test_lane.py``; the torchrun processes' own links, in ``test_torchrun_trust.py``.
"""

from __future__ import annotations

import os
import time

import pytest

from dispatchcore import Dispatch, Worker, WorkerDiedError, WorkerGroup, register

pytestmark = pytest.mark.timeout(120)


class Forker(Worker):
    @register(Dispatch.ONE_TO_ALL)
    def fork_and_die(self) -> None:
        """Leave a child holding every inherited descriptor, then exit: the link outlives the rank."""
        if self.rank == 1:
            if os.fork() == 0:
                time.sleep(30)
                os._exit(0)
            time.sleep(0.2)
            os._exit(3)

    @register(Dispatch.ONE_TO_ALL)
    def ping(self) -> int:
        return self.rank


@pytest.mark.slow
@pytest.mark.timeout(60)  # unreported, the call would wait for its death_timeout (600 s)
def test_a_rank_whose_link_outlives_it_is_still_reported_dead() -> None:
    with WorkerGroup(Forker, 2, backend="torchrun", death_timeout=600) as group:
        assert group.ping() == [0, 1]
        with pytest.raises(WorkerDiedError, match="exited with code 3") as info:
            group.fork_and_die()
        assert info.value.rank == 1
