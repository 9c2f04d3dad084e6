"""verl's trainer-level surface on real Ray (issue 23), without verl installed.

What verl 0.9.1's ``RayPPOTrainer``, rollout replicas and checkpoint engine
touch beyond the single-controller unit tests: ``RayWorkerGroup``'s extra
keywords, ``worker_handles`` groups, verl's result shapes for
``blocking=False`` calls, ``_dispatch_info`` on groups and views, and the
pool names (``SubRayResourcePool``, ``ResourcePoolManager``, ``pgs``).  The
session Ray has no GPUs; ``test_verl_gpu_pools.py`` covers logical GPUs.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

import pytest
import torch

ray = pytest.importorskip("ray")
cloudpickle = pytest.importorskip("cloudpickle")

from dispatchcore import (  # noqa: E402
    DataProto,
    DataProtoFuture,
    Dispatch,
    DispatchTimeoutError,
    Execute,
    Worker,
    WorkerError,
    create_colocated_worker_cls,
    register,
)
from executors_ray import (  # noqa: E402
    PlacementError,
    RayClassWithInitArgs,
    RayResourcePool,
    RayWorkerGroup,
    ResourcePoolManager,
    SubRayResourcePool,
    split_resource_pool,
)
from executors_ray.testing import ray_session  # noqa: E402, F401

pytestmark = [pytest.mark.usefixtures("ray_session"), pytest.mark.timeout(120)]

cloudpickle.register_pickle_by_value(sys.modules[__name__])


class Trainee(Worker):
    """Registers methods the way verl's workers do (no model)."""

    def __init__(self) -> None:
        self.version = 0
        self._register_dispatch_collect_info("actor", dp_rank=self.rank // 2, is_collect=self.rank % 2 == 0)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def update_weights(self, version: int) -> int:
        self.version = version
        return self.rank * 100 + version

    @register(dispatch_mode=Dispatch.ALL_TO_ALL, blocking=False)
    def per_rank(self, x: int) -> int:
        return x * 10 + self.rank

    @register(dispatch_mode=Dispatch.DP_COMPUTE, blocking=False)
    def dp(self, x: int) -> int:
        return -x

    @register(dispatch_mode=Dispatch.DP_COMPUTE_METRIC, blocking=False)
    def metric(self, data: DataProto) -> int:
        return len(data)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, execute_mode=Execute.RANK_ZERO, blocking=False)
    def zero(self) -> int:
        return self.rank + 7

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO, blocking=False)
    def rows(self, data: DataProto) -> DataProto:
        data.batch["x"] = data.batch["x"] + 1
        return data

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def fail(self) -> None:
        raise RuntimeError(f"rank {self.rank} refuses")

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def get_version(self) -> int:
        return self.version

    def nap(self, seconds: float) -> int:  # not registered: execute_all_async runs it by name
        time.sleep(seconds)
        return self.rank


class Critic(Worker):
    def __init__(self) -> None:
        self._register_dispatch_collect_info("critic", dp_rank=0, is_collect=self.rank == 0)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def ping(self) -> str:
        return f"critic{self.rank}"


def cpu_pool(n: int, **kwargs: object) -> RayResourcePool:
    return RayResourcePool([n], use_gpu=False, cpus_per_process=0.25, **kwargs)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def wg() -> object:
    group = RayWorkerGroup(cpu_pool(4), RayClassWithInitArgs(ray.remote(Trainee)), name_prefix="verl_surface")
    yield group
    group.shutdown()


# -- point 3: result shapes -------------------------------------------------------
def test_one_to_all_non_blocking_gives_object_refs_that_ray_get_takes(wg: RayWorkerGroup) -> None:
    refs = wg.update_weights(3)
    assert isinstance(refs, list) and len(refs) == 4
    assert all(isinstance(r, ray.ObjectRef) for r in refs)
    assert ray.get(refs) == [3, 103, 203, 303]
    assert wg.get_version() == [3, 3, 3, 3]


def test_ref_lists_concatenate_with_plus_and_resolve_with_get(wg: RayWorkerGroup) -> None:
    both = wg.update_weights(1) + wg.per_rank([1, 2, 3, 4])
    assert ray.get(both) == [1, 101, 201, 301, 10, 21, 32, 43]
    assert wg.dp([5, 6, 7, 8]).get() == [-5, -6, -7, -8]


def test_metric_mode_gives_refs_and_rank_zero_one_ref(wg: RayWorkerGroup) -> None:
    data = DataProto.from_dict({"x": torch.arange(8)})
    assert ray.get(wg.metric(data)) == [2, 2, 2, 2]
    one = wg.zero()
    assert isinstance(one, ray.ObjectRef) and ray.get(one) == 7


def test_dp_proto_modes_keep_the_data_proto_future(wg: RayWorkerGroup) -> None:
    future = wg.rows(DataProto.from_dict({"x": torch.arange(8)}))
    assert isinstance(future, DataProtoFuture)
    assert future.get().batch["x"].tolist() == list(range(1, 9))


def test_a_raising_worker_surfaces_at_ray_get_as_worker_error(wg: RayWorkerGroup) -> None:
    with pytest.raises(WorkerError, match="refuses"):
        ray.get(wg.fail(), timeout=60)


def _wait_until_dead(actor: Any, timeout: float = 60.0) -> None:
    """``ray.kill`` lands asynchronously: a task sent just after it may still run, so ask until one fails."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            ray.get(actor.__ray_ready__.remote(), timeout=timeout)
        except ray.exceptions.RayActorError:
            return
        assert time.monotonic() < deadline, "the killed actor still answers"
        time.sleep(0.05)


def test_ray_get_on_a_dead_actor_is_rays_actor_died_error() -> None:
    group = RayWorkerGroup(cpu_pool(1), RayClassWithInitArgs(Trainee), name_prefix="verl_dead")
    try:
        ray.kill(group.workers[0], no_restart=True)
        _wait_until_dead(group.workers[0])
        with pytest.raises(ray.exceptions.RayActorError):
            ray.get(group.update_weights(1), timeout=60)
    finally:
        group.shutdown()


def test_async_calls_by_name_and_refs_take_the_groups_pipeline_and_its_bounds() -> None:
    group = RayWorkerGroup(cpu_pool(2), RayClassWithInitArgs(Trainee), name_prefix="verl_bounded", call_timeout=3)
    try:
        first, second = group.execute_all_async("nap", 0.2), group.execute_rank_zero_async("nap", 0)
        assert ray.get(first) == [0, 1] and ray.get(second) == 0  # in the order asked
        refs = group.execute_all_async("nap", 600)  # the group's call_timeout bounds it, as any call
        with pytest.raises(DispatchTimeoutError):
            refs.get()
        with pytest.raises(DispatchTimeoutError):
            ray.get(refs, timeout=120)  # the refs raise what the call raised
    finally:
        group.shutdown()


def test_options_goes_back_to_the_cores_bounded_future(wg: RayWorkerGroup) -> None:
    future = wg.update_weights.options(timeout=60)(2)
    assert future.get() == [2, 102, 202, 302]


# -- point 4: attributes the trainer reads ------------------------------------------
def test_dispatch_info_as_balance_batch_reads_it(wg: RayWorkerGroup) -> None:
    assert wg._dispatch_info == {} or "actor" in wg._dispatch_info
    if "actor" not in wg._dispatch_info:
        wg._dispatch_info["actor"] = wg._query_dispatch_info("actor")
    assert wg._dispatch_info["actor"] == [0, 0, 1, 1]
    view = wg[0:2]
    assert view._dispatch_info == {}
    assert view._query_dispatch_info("actor") == [0, 0]
    assert wg.use_gpu is False and wg.device_name == "cuda" and wg.sub_cls_name == ""
    assert view.device_name == "cuda"
    assert wg.master_address and wg.master_port
    assert wg._world_size == 4 and len(wg._workers) == 4


def test_spawned_roles_have_dispatch_info_and_sub_cls_name() -> None:
    cls = create_colocated_worker_cls({"actor": RayClassWithInitArgs(Trainee), "critic": RayClassWithInitArgs(Critic)})
    group = RayWorkerGroup(cpu_pool(2), RayClassWithInitArgs(cls), name_prefix="verl_roles")
    try:
        roles = group.spawn(prefix_set=["actor", "critic"])
        actor, critic = roles["actor"], roles["critic"]
        assert actor.sub_cls_name == "actor" and critic.sub_cls_name == "critic"
        assert actor._dispatch_info == {} and actor._dispatch_info is not critic._dispatch_info
        assert actor._query_dispatch_info("actor") == [0, 0]
        assert critic._query_dispatch_info("critic") == [0, 0]
        assert ray.get(actor.update_weights(4) + critic.ping()) == [4, 104, "critic0", "critic1"]
    finally:
        group.shutdown()


# -- point 2: keywords ---------------------------------------------------------------
def test_worker_handles_group_calls_existing_actors_and_never_kills_them(wg: RayWorkerGroup) -> None:
    ray.get(wg.update_weights(5))
    handles = list(reversed(wg.workers[:3]))
    sync = RayWorkerGroup(worker_handles=handles, ray_cls_with_init=RayClassWithInitArgs(cls=Trainee))
    assert sync.world_size == 3
    assert ray.get(sync.update_weights(9)) == [209, 109, 9]  # rank i is the i-th handle
    sync.shutdown()
    assert wg.get_version() == [9, 9, 9, 5]  # the original group's actors live on


def test_verl_keywords_are_taken(caplog: pytest.LogCaptureFixture) -> None:
    pool = cpu_pool(2)
    with caplog.at_level(logging.WARNING, logger="executors_ray.verl"):
        group = RayWorkerGroup(
            resource_pool=pool,
            ray_cls_with_init=RayClassWithInitArgs(Trainee),
            bin_pack=False,
            name_prefix="verl_kw",
            ray_wait_register_center_timeout=120,
            profile_steps=[1, 2],
            worker_nsight_options={"capture-range-end": None},
            use_gpu=False,
            device_name="cuda",
            master_addr="10.0.0.1",
            master_port="1234",
        )
    try:
        assert pool.strategy == "PACK"
        assert group.profile_steps == [1, 2] and group._ray_wait_register_center_timeout == 120
        assert group.executor.options["start_timeout"] == 120.0
        text = caplog.text
        assert "worker_nsight_options" in text and "not applicable" in text and "master_addr" in text
        assert ray.get(group.update_weights(1)) == [1, 101]
    finally:
        group.shutdown()


def test_use_gpu_true_on_a_cpu_pool_names_the_fix() -> None:
    with pytest.raises(ValueError, match="use_gpu=False"):
        RayWorkerGroup(cpu_pool(1), RayClassWithInitArgs(Trainee), use_gpu=True)


# -- point 1: pools ------------------------------------------------------------------
def test_pool_defaults_and_positional_order_are_verls() -> None:
    pool = RayResourcePool([2, 2], False, "named", 3, False)
    assert (pool.use_gpu, pool.name_prefix, pool.max_colocate_count, pool.detached) == (False, "named", 3, False)
    default = RayResourcePool([1])
    assert default.use_gpu is True and default.max_colocate_count == 10 and default.pgs is None
    assert pool.local_world_size_list() == [2, 2, 2, 2] and pool.local_rank_list() == [0, 1, 0, 1]
    assert pool() == [2, 2] and pool.n_gpus_per_node == 8


def test_gpu_pool_on_a_cluster_without_gpus_names_the_fix() -> None:
    with pytest.raises(PlacementError, match=r"use_gpu=False.*num_gpus=N"):
        RayWorkerGroup(RayResourcePool([1]), RayClassWithInitArgs(Trainee))


def test_pgs_and_sub_pools_share_placement_groups() -> None:
    pool = cpu_pool(4)
    parts = split_resource_pool(pool, 2)
    assert all(isinstance(p, SubRayResourcePool) for p in parts)
    assert [p.start_bundle_index for p in parts] == [0, 2]
    groups = pool.get_placement_groups()
    assert pool.pgs == groups and len(groups) == 1 and parts[1].pgs == groups
    own = SubRayResourcePool(groups, 1, 2, process_on_nodes=[4], use_gpu=False, cpus_per_process=0.25)
    wg = RayWorkerGroup(own, RayClassWithInitArgs(Trainee), name_prefix="verl_sub")
    try:
        assert wg.world_size == 2 and ray.get(wg.update_weights(0)) == [0, 100]
    finally:
        wg.shutdown()
    assert pool.pgs == groups  # the adopting pool never removes what it did not make
    pool.remove()


def test_resource_pool_manager_is_verls() -> None:
    manager = ResourcePoolManager({"global_pool": [2]}, {"actor": "global_pool", "critic": "global_pool"})
    assert manager.max_colocate_count == 3 and manager.resource_pool_dict == {}
    assert manager.get_n_gpus() == 2
    with pytest.raises(ValueError, match=r"needs 2 GPU\(s\).*num_gpus=N"):
        manager.create_resource_pool()  # the session Ray has no GPUs
    pool = manager.resource_pool_dict["global_pool"]
    assert manager.get_resource_pool("critic") is pool and pool.use_gpu and pool.max_colocate_count == 3
    with pytest.raises(KeyError, match="not in mapping"):
        manager.get_resource_pool("reward")
