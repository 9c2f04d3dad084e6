"""The core's own work on the ranks is typed (``Operation``), never a method it calls by a reserved name.

The mesh query and the replica hand-over run whatever methods a worker defines, under whatever names;
per role of a colocated or fused class the mesh query reads that role's declaration.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from dispatchcore import (
    Dispatch,
    Worker,
    WorkerError,
    WorkerGroup,
    create_colocated_worker_cls,
    create_colocated_worker_raw_cls,
    register,
)


class Actor(Worker):
    def __init__(self) -> None:
        self._register_dispatch_collect_info("m", dp_rank=self.rank, is_collect=True)

    @register(Dispatch.ONE_TO_ALL)
    def ping(self) -> int:
        return self.rank

    def _dispatchcore_mesh_info(self, mesh_name: str) -> Any:
        """The old reserved name, now only the worker's own: the core never calls it."""
        raise AssertionError("the core called a worker method by a reserved name")

    def _dispatchcore_weights_version(self) -> Any:
        raise AssertionError("the core called a worker method by a reserved name")


class Critic(Worker):
    def __init__(self) -> None:
        self._register_dispatch_collect_info("m", dp_rank=0, is_collect=self.rank == 0)

    @register(Dispatch.ONE_TO_ALL)
    def ping(self) -> int:
        return -self.rank


def test_the_mesh_query_names_no_method() -> None:
    with WorkerGroup(Actor, 2, backend="local") as wg:
        assert wg.mesh_ranks("m") == [(0, True), (1, True)]
        assert all("dispatchcore" not in name for name in wg.executor.spec.methods)
        with pytest.raises(WorkerError, match="registered no mesh 'absent'") as info:
            wg.mesh_ranks("absent")
        assert info.value.rank == 0
        with pytest.raises(TypeError, match="a mesh name is a string"):
            wg.mesh_ranks(3)  # type: ignore[arg-type]
        assert wg.ping() == [0, 1]


@pytest.mark.parametrize("make", [create_colocated_worker_cls, create_colocated_worker_raw_cls])
def test_the_mesh_query_reads_each_roles_declaration(make: Any) -> None:
    cls = make({"actor": Actor, "critic": Critic})
    assert not [name for name in vars(cls) if "dispatchcore_mesh" in name]  # no forwarder per role
    with WorkerGroup(cls, 2, backend="local") as wg:
        roles = wg.spawn({"actor", "critic"})
        assert roles["actor"].mesh_ranks("m") == [(0, True), (1, True)]
        assert roles["critic"].mesh_ranks("m") == [(0, True), (0, False)]
        assert roles["critic"].ping() == [0, -1]
        with pytest.raises(WorkerError, match="registered no mesh 'absent'"):
            roles["actor"].mesh_ranks("absent")
        assert {"actor_ping", "critic_ping"} <= set(wg.executor.spec.methods)
        assert all("dispatchcore" not in name for name in wg.executor.spec.methods)


def test_a_role_view_over_some_ranks_numbers_its_dp_ranks_from_zero() -> None:
    with WorkerGroup(create_colocated_worker_cls({"actor": Actor, "critic": Critic}), 3, backend="local") as wg:
        actor = wg.spawn({"actor"})["actor"]
        assert actor[1:].mesh_ranks("m") == [(0, True), (1, True)]


class Replica(Worker):
    """Hands its trained state to a new rank; the hand-over's old reserved names are only its own methods."""

    @register(Dispatch.ONE_TO_ALL, setup=True)
    def init_model(self) -> None:
        self.weight = torch.zeros(4)

    @register(Dispatch.ONE_TO_ALL)
    def train(self, step: float, version: int) -> None:
        self.weight += step
        self.weights_version = version

    @register(Dispatch.ONE_TO_ALL)
    def read(self) -> tuple[float, Any]:
        return float(self.weight.sum()), getattr(self, "weights_version", None)

    def replica_state(self) -> dict[str, torch.Tensor]:
        return {"weight": self.weight}

    def load_replica_state(self, state: dict[str, torch.Tensor]) -> None:
        self.weight = state["weight"].clone()

    def _dispatchcore_weights_version(self) -> Any:
        raise AssertionError("the core called a worker method by a reserved name")

    def _dispatchcore_replica_part(self, tensors: Any) -> None:
        raise AssertionError("the core called a worker method by a reserved name")

    def _dispatchcore_replica_load(self, version: Any) -> None:
        raise AssertionError("the core called a worker method by a reserved name")


def test_a_new_rank_takes_a_replicas_state_by_the_core_operation() -> None:
    with WorkerGroup(Replica, 2, backend="local") as wg:
        wg.init_model()
        wg.train(1.5, 7)
        resized = wg.grow(1)
        assert resized.world_size == 3
        assert wg.read() == [(6.0, 7)] * 3  # the new rank took rank 0's weights and version
