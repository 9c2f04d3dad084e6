"""A rank whose process stops answering (SIGSTOP: frozen, not dead) is given up after ``death_timeout``.

Ray pings busy ranks through a control thread, every quarter of
``death_timeout``; silence for ``death_timeout`` is a death.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Any

import cloudpickle
import pytest

from dispatchcore import Dispatch, Worker, WorkerDiedError, WorkerGroup, register

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

# Ray's workers cannot import tests/: the worker class travels by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


class Sleeper(Worker):
    @register(Dispatch.ONE_TO_ALL)
    def pid(self) -> int:
        return os.getpid()

    @register(Dispatch.ONE_TO_ALL)
    def sleep(self, seconds: float) -> int:
        import time

        time.sleep(seconds)
        return self.rank


def test_a_frozen_ray_rank_is_given_up_after_death_timeout(ray_session: Any) -> None:
    with WorkerGroup(Sleeper, 2, backend="ray", death_timeout=2) as wg:
        pid = wg.pid()[1]
        threading.Timer(0.5, os.kill, (pid, signal.SIGSTOP)).start()
        try:
            with pytest.raises(WorkerDiedError, match="has not answered a liveness ping for 2 s") as died:
                wg.sleep(600)  # only giving the frozen rank up ends this call before the test's timeout
            assert died.value.rank == 1
        finally:
            os.kill(pid, signal.SIGCONT)
