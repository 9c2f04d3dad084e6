"""verl's Ray surface on real Ray actors (issue 14): worker env, fused groups, TensorDicts through actors.

One local Ray for the run (``ray_session``); worker classes travel by value
(this module is registered with cloudpickle), as they do from a verl driver
script.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

ray = pytest.importorskip("ray")
cloudpickle = pytest.importorskip("cloudpickle")
tensordict = pytest.importorskip("tensordict")
from tensordict import TensorDict  # noqa: E402

from dispatchcore import (  # noqa: E402
    DataProto,
    Dispatch,
    Worker,
    WorkerGroup,
    make_nd_compute_dataproto_dispatch_fn,
    register,
)
from executors_ray import (  # noqa: E402
    RayClassWithInitArgs,
    RayResourcePool,
    RayWorkerGroup,
    create_colocated_worker_cls_fused,
    create_colocated_worker_raw_cls,
)
from executors_ray.testing import ray_session  # noqa: E402, F401

pytestmark = [pytest.mark.usefixtures("ray_session"), pytest.mark.timeout(120)]

cloudpickle.register_pickle_by_value(sys.modules[__name__])

ENV_KEYS = ("RAY_LOCAL_RANK", "RAY_LOCAL_WORLD_SIZE", "LOCAL_RANK", "FROM_CLASS", "FROM_GROUP")


class EnvActor(Worker):
    def __init__(self) -> None:
        self.seen = {k: os.environ.get(k) for k in ENV_KEYS}  # what __init__ already sees
        self._register_dispatch_collect_info("td", dp_rank=self.rank, is_collect=True)

    def getenv(self, key: str) -> str:  # undecorated, as in verl's test: execute_all_sync reaches it
        return os.environ.get(key, f"{key} not set")

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def seen_at_init(self) -> dict[str, str | None]:
        return self.seen

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn("td"), blocking=False)
    def ragged_widths(self, data: TensorDict) -> TensorDict:
        data["widths"] = torch.tensor([row.shape[-1] for row in data["pos"].unbind(0)])
        return data


class Adder(Worker):
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def add(self, x: float) -> float:
        return x + self.rank

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def add_rows(self, data: DataProto) -> DataProto:
        data.batch["a"] += self.rank
        return data


class Subber(Worker):
    def __init__(self, val: float) -> None:
        self.val = val

    @register(dispatch_mode=Dispatch.ALL_TO_ALL)
    def sub(self, x: float) -> float:
        return x - self.val


ROLES = {"actor": RayClassWithInitArgs(cls=ray.remote(Adder)), "critic": RayClassWithInitArgs(cls=Subber, val=10)}


class Hybrid(create_colocated_worker_raw_cls(ROLES)):  # type: ignore[misc]
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def foo(self, x: float) -> float:
        return self.critic.sub(self.actor.add(x))


def small_pool(n: int) -> RayResourcePool:
    return RayResourcePool([n], use_gpu=False, cpus_per_process=0.25)


def test_worker_env_and_ray_local_rank_reach_every_worker_before_init() -> None:
    spec = RayClassWithInitArgs(cls=ray.remote(EnvActor))
    spec.update_options({"runtime_env": {"env_vars": {"FROM_CLASS": "c"}}})
    wg = RayWorkerGroup(small_pool(2), spec, name_prefix="verl_env", worker_env={"FROM_GROUP": "g"})
    try:
        assert wg.execute_all_sync("getenv", key="RAY_LOCAL_WORLD_SIZE") == ["2", "2"]
        assert wg.execute_all_sync("getenv", key="FROM_GROUP") == ["g", "g"]
        seen = wg.seen_at_init()
        assert [s["RAY_LOCAL_RANK"] for s in seen] == [s["LOCAL_RANK"] for s in seen] == ["0", "1"]
        assert {(s["FROM_CLASS"], s["FROM_GROUP"]) for s in seen} == {("c", "g")}
        # TensorDicts with jagged rows through real actors, as a future (verl's test_decorator_dp_compute_td).
        pos = torch.nested.as_nested_tensor(
            [torch.arange(n).expand(4, n).contiguous() for n in (3, 4, 5, 6)], layout=torch.jagged
        )
        out = wg.ragged_widths(TensorDict({"x": torch.arange(4), "pos": pos}, batch_size=[4])).get()
        assert out["widths"].tolist() == [3, 4, 5, 6]
        assert [r.shape for r in out["pos"].unbind(0)] == [r.shape for r in pos.unbind(0)]
    finally:
        wg.shutdown()


@pytest.mark.parametrize("key", ["WORLD_SIZE", "RAY_LOCAL_RANK"])
def test_worker_env_may_not_override_what_the_executor_sets(key: str) -> None:
    with pytest.raises(ValueError, match=key):
        RayWorkerGroup(small_pool(1), RayClassWithInitArgs(EnvActor), worker_env={key: "100"})


def test_plain_ray_groups_see_ray_local_rank_too() -> None:
    with WorkerGroup(EnvActor, 2, backend="ray") as wg:
        assert [s["RAY_LOCAL_RANK"] for s in wg.seen_at_init()] == ["0", "1"]


def test_fused_group_verl_style() -> None:
    """verl's test_fused_workers_on_cpu, plus the fused class through create_colocated_worker_cls_fused."""
    spec = RayClassWithInitArgs(cls=ray.remote(Hybrid))
    spec.fused_worker_used = True
    fused = RayWorkerGroup(resource_pool=small_pool(2), ray_cls_with_init=spec)
    try:
        fused.fuse(ROLES.keys())
        x = fused.actor.add(0.1)
        assert x == [0.1, 1.1]
        assert fused.critic.sub(x) == fused.foo(0.1)
        assert len(fused.actor.workers) == 2 and fused.actor.workers == fused.workers
    finally:
        fused.shutdown()
    pool = small_pool(2)
    wg = RayWorkerGroup(resource_pool=pool, ray_cls_with_init=create_colocated_worker_cls_fused(ROLES))
    try:
        actor = wg.spawn(prefix_set=ROLES.keys())["actor"]
        out = actor.add_rows(DataProto.from_dict({"a": torch.zeros(4)}))
        assert out.batch["a"].tolist() == [0.0, 0.0, 1.0, 1.0]
        wg.__dict__["critic"] = "an attribute of the driver's own"
        with pytest.raises(ValueError, match="role 'critic' would hide"):
            wg.fuse(ROLES.keys())
    finally:
        wg.shutdown()
