"""``dispatchcore.collective.init_process_group``: torch's default group over exactly one worker group's ranks.

FSDP2 (``fully_shard``) and ``torch.distributed.checkpoint`` need the
default group and a ``DeviceMesh``; the call makes both on the executor's
store, idempotently, and refuses where it cannot (threads, a process that
already holds a default group).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import cloudpickle
import pytest
import torch

from dispatchcore import Dispatch, DispatchError, Worker, WorkerError, WorkerGroup, collective, register

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _sharded_model(seed: int, mesh: Any) -> torch.nn.Module:
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 6), torch.nn.Linear(6, 2))
    fully_shard(model, mesh=mesh)
    return model


class Trainer(Worker):
    """A tiny model sharded over the group with FSDP2, one SGD step, a DCP round trip."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def setup(self) -> tuple[bool, int, int]:
        self.mesh = collective.init_process_group()
        again = collective.init_process_group()  # a colocated role asking again gets the same mesh
        self.model = _sharded_model(0, self.mesh)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)
        summed = collective.all_reduce(torch.ones(1))  # the library's own group still works beside it
        return again is self.mesh, self.mesh.size(), int(summed.item())

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def train_step(self, failing_rank: int = -1) -> float:
        if self.rank == failing_rank:
            raise ValueError("a bad batch")
        torch.manual_seed(1)
        batch = torch.randn(4, 8)
        loss = self.model(batch).pow(2).mean()
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad()
        return float(loss.detach())

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def weights(self) -> tuple[int, list[float]]:
        """This process and the full weights (gathered over the group)."""
        return os.getpid(), [float(value.full_tensor().sum()) for value in self.model.state_dict().values()]

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def checkpoint_round_trip(self, path: str) -> bool:
        import torch.distributed.checkpoint as dcp

        dcp.save({"model": self.model.state_dict()}, checkpoint_id=path)
        fresh = _sharded_model(7, self.mesh)
        state = {"model": fresh.state_dict()}
        dcp.load(state, checkpoint_id=path)
        fresh.load_state_dict(state["model"])
        trained = self.model.state_dict()
        return all(
            torch.equal(value.full_tensor(), trained[name].full_tensor()) for name, value in fresh.state_dict().items()
        )

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def users_own_group_first(self) -> None:
        import torch.distributed as dist

        dist.init_process_group("gloo")
        collective.init_process_group()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_fsdp2_trains_and_checkpoints_over_the_groups_process_group(tmp_path: Path) -> None:
    with WorkerGroup(Trainer, 2, backend="torchrun") as wg:
        assert wg.setup() == [(True, 2, 2)] * 2
        first, second = wg.train_step(), wg.train_step()
        assert first[0] == first[1] and second[0] == second[1]
        assert second[0] < first[0]
        assert wg.checkpoint_round_trip(str(tmp_path / "checkpoint")) == [True, True]


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("backend", ["torchrun", "ray"])
def test_a_rank_that_raises_before_an_fsdp2_step_frees_the_others_from_its_all_gather(
    backend: str, request: pytest.FixtureRequest
) -> None:
    """Rank 0 waits in FSDP2's all-gather for rank 1, which raised: the abort frees it, nothing is lost."""
    if backend == "ray":
        request.getfixturevalue("ray_session")
    with WorkerGroup(Trainer, 2, backend=backend, cancel_grace=600) as wg:
        wg.setup()
        first = wg.train_step()
        before = wg.weights()
        with pytest.raises(WorkerError) as raised:
            wg.train_step(failing_rank=1)
        assert raised.value.rank == 1
        assert wg.weights() == before
        again = wg.train_step()
        assert again[0] == again[1] < first[0]


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_process_that_holds_another_default_group_is_refused() -> None:
    with WorkerGroup(Trainer, 2, backend="torchrun") as wg:
        with pytest.raises(WorkerError, match=r"already holds torch's default process group.*by the user"):
            wg.users_own_group_first()


def test_threads_of_one_process_are_pointed_at_torchrun() -> None:
    with WorkerGroup(Trainer, 2, backend="local") as wg:
        with pytest.raises(WorkerError, match=r"threads of one process.*backend='torchrun'"):
            wg.setup()


def test_outside_a_worker_it_refuses() -> None:
    with pytest.raises(DispatchError, match="inside a worker method"):
        collective.init_process_group()


LAUNCHED = textwrap.dedent(
    """
    import os
    import torch
    import torch.distributed as dist
    from dispatchcore import Dispatch, Worker, WorkerError, WorkerGroup, collective, register


    class Meshed(Worker):
        @register(Dispatch.ONE_TO_ALL)
        def mesh(self):
            mesh = collective.init_process_group()
            total = torch.tensor([float(self.rank + 1)])
            dist.all_reduce(total)
            return os.environ["WORLD_SIZE"], dist.get_world_size(), dist.get_rank(), mesh.size(), total.item()

        @register(Dispatch.ONE_TO_ALL)
        def step(self, failing_rank=-1):
            if self.rank == failing_rank:
                raise ValueError("a bad batch")
            return collective.all_reduce(torch.ones(1)).item(), os.getpid()


    print("mesh", WorkerGroup(Meshed, 2, backend="torchrun", ranks=[1, 2]).mesh())
    wg = WorkerGroup(Meshed, backend="torchrun", cancel_grace=600)
    pids = [pid for _, pid in wg.step()]
    try:
        wg.step(1)
    except WorkerError as exc:
        print("raised", exc.rank)
    print("again", wg.step() == [(3.0, pid) for pid in pids])
    """
)


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.skipif(shutil.which("torchrun") is None, reason="torchrun is not on PATH")
def test_under_the_launcher_with_a_subset_of_its_ranks(tmp_path: Path) -> None:
    """A launch of 3; the default group spans the group's 2 ranks (as its ``WORLD_SIZE`` says), on its store."""
    script = tmp_path / "launched.py"
    script.write_text(LAUNCHED)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHELASTIC", "RANK", "MASTER_"))}
    command = [shutil.which("torchrun") or "torchrun", "--standalone", "--nproc-per-node=3", str(script)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=200, env=env, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.splitlines() == [
        "mesh [('2', 2, 0, 2, 3.0), ('2', 2, 1, 2, 3.0)]",
        "raised 1",
        "again True",
    ]
