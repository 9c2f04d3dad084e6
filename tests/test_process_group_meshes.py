"""Meshes and sub-groups on ``collective.init_process_group``'s group: built by the library or by the user.

``init_device_mesh`` of any shape, ``DeviceMesh(...)`` and ``dist.new_group``
all call the library backend's creator with the sub-group's global ranks;
their collectives run on communicators the library aborts with the whole,
so a rank raising while the others wait in a sub-group frees them.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import cloudpickle
import pytest
import torch

from dispatchcore import Dispatch, Worker, WorkerError, WorkerGroup, collective, register

cloudpickle.register_pickle_by_value(sys.modules[__name__])


class Meshes(Worker):
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def build(self) -> dict[str, Any]:
        import torch.distributed as dist
        from torch.distributed.device_mesh import DeviceMesh

        self.mesh = collective.init_process_group(mesh_shape=(2, 2), mesh_dim_names=("dp", "tp"))
        again = collective.init_process_group(mesh_shape=(2, 2), mesh_dim_names=("dp", "tp"))
        flat = collective.init_process_group()
        own = DeviceMesh("cpu", [[0, 2], [1, 3]])
        self.pair = dist.new_group([0, 2])
        sums = {}
        for name, group in (
            ("dp", self.mesh.get_group("dp")),
            ("tp", self.mesh.get_group("tp")),
            ("own", own.get_group(1)),
        ):
            value = torch.tensor([float(self.rank)])
            dist.all_reduce(value, group=group)
            sums[name] = value.item()
        if self.rank in (0, 2):
            value = torch.ones(1)
            dist.all_reduce(value, group=self.pair)
            sums["pair"] = value.item()
        return {"same": again is self.mesh, "shape": tuple(self.mesh.shape), "flat": flat.size(), **sums}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def reduce_in_pair(self, failing_rank: int = -1) -> tuple[int, float]:
        import torch.distributed as dist

        if self.rank == failing_rank:
            raise ValueError("a bad batch")
        value = torch.ones(1)
        if self.rank in (0, 2):
            dist.all_reduce(value, group=self.pair)
        dist.all_reduce(value, group=self.mesh.get_group("tp"))
        return os.getpid(), value.item()


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_meshes_and_sub_groups_of_any_shape_run_and_recover_on_the_librarys_group() -> None:
    with WorkerGroup(Meshes, 4, backend="torchrun", cancel_grace=600.0) as wg:
        built = wg.build()
        assert [b["same"] for b in built] == [True] * 4
        assert [b["shape"] for b in built] == [(2, 2)] * 4
        assert [b["flat"] for b in built] == [4] * 4
        assert [(b["dp"], b["tp"], b["own"]) for b in built] == [
            (2.0, 1.0, 2.0),
            (4.0, 1.0, 4.0),
            (2.0, 5.0, 2.0),
            (4.0, 5.0, 4.0),
        ]
        assert [b.get("pair") for b in built] == [2.0, None, 2.0, None]
        pids = [pid for pid, _ in wg.reduce_in_pair()]
        with pytest.raises(WorkerError) as raised:
            wg.reduce_in_pair(failing_rank=2)  # rank 0 waits for it in the pair, rank 1 in the tp group
        assert raised.value.rank == 2
        assert wg.reduce_in_pair.options(timeout=60)() == [
            (pid, value) for pid, value in zip(pids, [3.0] * 4, strict=True)
        ]


class AsksForAMesh(Worker):
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def mesh(self, shape: Any, names: Any = None) -> None:
        collective.init_process_group(mesh_shape=shape, mesh_dim_names=names)


@pytest.mark.parametrize(
    ("shape", "names", "match"),
    [
        ((3,), None, r"mesh_shape \(3,\) holds 3 ranks, but the group has 2"),
        ((0, 2), None, "mesh_shape must be positive ints"),
        ((2, 1), ("dp",), "mesh_dim_names must be 2 distinct strings"),
        ((2, 1), ("dp", "dp"), "mesh_dim_names must be 2 distinct strings"),
    ],
)
def test_a_mesh_the_group_cannot_hold_is_refused_naming_the_fix(shape: Any, names: Any, match: str) -> None:
    with WorkerGroup(AsksForAMesh, 2, backend="local") as wg, pytest.raises(WorkerError, match=match) as raised:
        wg.mesh(shape, names)
    assert raised.value.exc_type == "DispatchError"
