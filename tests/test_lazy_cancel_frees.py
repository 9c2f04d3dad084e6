"""A lazy call that ends early (cancelled, raised, timed out) leaves nothing kept on its ranks.

Its result is never adopted by the driver, so no handle would ever free it:
the ledger queues the free itself, and the next call carries it.
"""

from __future__ import annotations

import gc
import time

import pytest
import torch

from dispatchcore import (
    CallCancelledError,
    DataProto,
    Dispatch,
    Worker,
    WorkerError,
    WorkerGroup,
    available_backends,
    register,
)
from dispatchcore.executor import kept_results

pytestmark = pytest.mark.timeout(120)


class Slow(Worker):
    @register(Dispatch.DP_COMPUTE_PROTO)
    def make(self, data: DataProto, pause: float = 0.0, fail_on: int = -1) -> DataProto:
        time.sleep(pause)
        if self.rank == fail_on:
            raise ValueError("this rank fails")
        return DataProto.from_dict({"x": data.batch["i"] * 2})

    @register(Dispatch.ONE_TO_ALL)
    def kept(self) -> int:
        return kept_results()


def _rows(n: int = 4) -> DataProto:
    return DataProto.from_dict({"i": torch.arange(n)})


@pytest.mark.parametrize("backend", ["local", "torchrun"])
def test_a_cancelled_or_failed_lazy_call_leaves_nothing_kept(backend: str) -> None:
    if backend not in available_backends():
        pytest.skip(f"{backend} unavailable")
    with WorkerGroup(Slow, 2, backend=backend) as wg:
        before = wg.kept()  # on local the row store is the test process's: other tests' rows count too
        future = wg.make.options(lazy=True, blocking=False)(_rows(), pause=0.5)
        time.sleep(0.05)
        future.cancel()
        with pytest.raises(CallCancelledError):
            future.get()
        with pytest.raises(WorkerError, match="this rank fails"):
            wg.make.options(lazy=True)(_rows(), fail_on=1)  # rank 0 kept its rows before rank 1 raised
        gc.collect()
        wg.kept()  # carries the frees; the cancelled ranks finished their call before this one ran
        assert wg.kept() == before
        kept = wg.make.options(lazy=True)(_rows())  # a lazy call that ends well still keeps its rows
        assert all(now > then for now, then in zip(wg.kept(), before, strict=True))
        assert torch.equal(kept.batch["x"], torch.arange(4) * 2)
