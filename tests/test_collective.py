"""``dispatchcore.collective``: one line in worker code, the right path on every backend.

The path follows the executor's declared capability (``ranks_share_process``),
never its name: threads reduce in memory, processes use the user's default
group when it spans the group, else a gloo group on the executor's own store,
rebuilt after a replacement.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

import cloudpickle
import pytest
import torch

from dispatchcore import (
    Dispatch,
    DispatchError,
    MembershipChange,
    Worker,
    WorkerError,
    WorkerGroup,
    collective,
    register,
)

# The ranks import nothing from tests/: the worker classes travel by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

BACKENDS = ["local", "torchrun", "multiprocess", "ray"]


class Reducer(Worker):
    """Every collective once, with values that show which rank's arrived where."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def everything(self) -> dict[str, Any]:
        mine = float(self.rank + 1)
        summed = collective.all_reduce(torch.tensor([mine, 2 * mine]))
        info = collective.rank_info()
        collective.barrier()
        return {
            "sum": summed.tolist(),
            "avg": collective.all_reduce(torch.tensor([mine]), op="avg").item(),
            "max": collective.all_reduce(torch.tensor([mine]), op="max").item(),
            "min": collective.all_reduce(torch.tensor([mine]), op="min").item(),
            "product": collective.all_reduce(torch.tensor([mine]), op="product").item(),
            "broadcast": collective.broadcast(torch.tensor([mine]), src=1).item(),
            "object": collective.broadcast_object({"from": self.rank, "rows": [self.rank] * 3}, src=1),
            "info": (info.backend, info.shares_process, info.rank, info.world_size, info.generation),
        }

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def pid(self) -> int:
        return os.getpid()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def reduce_rank(self) -> tuple[float, int]:
        return collective.all_reduce(torch.tensor([float(self.rank + 1)])).item(), collective.rank_info().generation

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def start_default_group(self) -> bool:
        """The user's own world (the fix the error names): collective uses it."""
        import torch.distributed as dist

        dist.init_process_group("gloo")
        return dist.is_initialized()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def close_default_group(self) -> None:
        import torch.distributed as dist

        dist.destroy_process_group()

    def on_membership_change(self, change: MembershipChange) -> None:
        # The executor's group already moved to the new generation: a collective works right here.
        collective.barrier()


def _backend(name: str) -> dict[str, Any]:
    if name == "ray":
        pytest.importorskip("ray")
    return {"backend": name}


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("backend", BACKENDS)
def test_every_collective_on_every_backend(backend: str, request: pytest.FixtureRequest) -> None:
    if backend == "ray":
        request.getfixturevalue("ray_session")
    with WorkerGroup(Reducer, 3, **_backend(backend)) as wg:
        results = wg.everything()
        shares = type(wg.executor).ranks_share_process  # type: ignore[attr-defined]
    for rank, got in enumerate(results):
        assert got["sum"] == [6.0, 12.0]
        assert (got["avg"], got["max"], got["min"], got["product"]) == (2.0, 3.0, 1.0, 6.0)
        assert got["broadcast"] == 2.0
        assert got["object"] == {"from": 1, "rows": [1, 1, 1]}
        assert got["info"] == (backend, shares, rank, 3, 0)
    assert shares is (backend == "local")


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_the_users_default_group_is_used_when_it_spans_the_group() -> None:
    with WorkerGroup(Reducer, 2, backend="multiprocess") as wg:
        assert wg.start_default_group() == [True, True]
        assert [r[0] for r in wg.reduce_rank()] == [3.0, 3.0]
        wg.close_default_group()
        assert [r[0] for r in wg.reduce_rank()] == [3.0, 3.0]  # and the executor's own group after it


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("backend", ["torchrun", "multiprocess"])
def test_the_executors_group_is_rebuilt_after_a_replacement(backend: str) -> None:
    options: dict[str, Any] = {"spare_ranks": 1} if backend == "torchrun" else {}
    with WorkerGroup(Reducer, 2, backend=backend, death_timeout=5, on_rank_death="replace", **options) as wg:
        assert wg.reduce_rank() == [(3.0, 0), (3.0, 0)]
        os.kill(wg.pid()[1], signal.SIGKILL)
        change = wg.replace_rank(1)  # the hook runs a barrier on the rebuilt group
        assert change.generation == 1
        assert wg.reduce_rank() == [(3.0, 1), (3.0, 1)]


def test_a_backend_without_a_store_says_how_to_fix_it() -> None:
    """The mock backend gives its ranks no link: the error names the user's own default group as the fix."""
    with WorkerGroup(Reducer, 2, backend="mock") as wg:
        with pytest.raises(WorkerError, match=r"no process group.*init_process_group"):
            wg.reduce_rank()


def test_outside_a_worker_it_refuses() -> None:
    with pytest.raises(DispatchError, match="inside a worker method"):
        collective.all_reduce(torch.zeros(1))


def test_an_unknown_op_is_refused() -> None:
    with pytest.raises(DispatchError, match="op must be one of"):
        collective.all_reduce(torch.zeros(1), op="mean")


def test_one_rank_needs_no_group() -> None:
    with WorkerGroup(Reducer, 1, backend="mock") as wg:
        assert wg.reduce_rank() == [(1.0, 0)]
