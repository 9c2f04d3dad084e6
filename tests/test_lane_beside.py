"""The core's beside calls (row reads and frees) ride the lane's control link and run while a call runs.

On the example plugin (``multiprocess``), an executor that is only the
core's ``LaneExecutor``: nothing of its own routes a beside call, so this
shows the lane's rank side answering them on its beside thread.
"""

from __future__ import annotations

import time

import pytest
import torch

from dispatchcore import DataProto, Dispatch, Worker, WorkerGroup, available_backends, register

pytestmark = [pytest.mark.timeout(120)]


class Busy(Worker):
    @register(Dispatch.DP_COMPUTE_PROTO)
    def gen(self, data: DataProto) -> DataProto:
        return DataProto.from_dict({"x": data.batch["ids"] * 10})

    @register(Dispatch.ONE_TO_ALL, blocking=False)
    def sleep_later(self, seconds: float) -> None:
        time.sleep(seconds)

    @register(Dispatch.ONE_TO_ALL)
    def ping(self) -> int:
        return self.rank


def test_a_driver_read_of_kept_rows_is_answered_while_the_rank_runs_a_long_call() -> None:
    if "multiprocess" not in available_backends():
        pytest.skip("the example plugin is not installed")
    with WorkerGroup(Busy, 2, backend="multiprocess") as wg:
        lazy = wg.gen.options(lazy=True)(DataProto.from_dict({"ids": torch.arange(6)}))
        busy = wg.sleep_later(3600)  # both ranks' method threads are taken for an hour
        assert torch.equal(lazy.batch["x"], torch.arange(6) * 10)  # read beside the running call
        assert not busy.done()
