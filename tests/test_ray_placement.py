"""The ray backend: resource pools, colocation, detached groups, verl adapters, forwarding."""

from __future__ import annotations

import pytest
import torch

ray = pytest.importorskip("ray")

from dispatchcore import DataProto, DispatchError, WorkerGroup, create_colocated_worker_cls  # noqa: E402
from dispatchcore.testing.conformance import batch  # noqa: E402
from dispatchcore.testing.workers import EchoWorker  # noqa: E402
from executors_ray import (  # noqa: E402
    RayClassWithInitArgs,
    RayResourcePool,
    RayWorkerGroup,
    attach_detached,
    kill_detached,
    split_resource_pool,
)
from executors_ray.testing import ray_session  # noqa: E402, F401
from ray_workers import Counter, DataWorker, Doubler  # noqa: E402

pytestmark = [pytest.mark.usefixtures("ray_session"), pytest.mark.timeout(120)]


def test_pool_shared_by_two_groups_with_fractional_shares():
    pool = RayResourcePool([2], use_gpu=False, max_colocate_count=2, cpus_per_process=1)
    first = WorkerGroup(DataWorker, 2, backend="ray", resource_pool=pool)
    second = WorkerGroup(DataWorker, 2, backend="ray", resource_pool=pool)
    try:
        a, b = first.placement(), second.placement()
        assert all(p["pg"] == a[0]["pg"] for p in a + b), "every actor on the pool's placement group"
        assert all(p["resources"].get("CPU") == 0.5 for p in a + b), [p["resources"] for p in a + b]
        assert set(first.pid()).isdisjoint(second.pid())
    finally:
        first.shutdown()
        assert pool._root._slots is not None, "pool kept while a group still uses it"
        second.shutdown()
    assert pool._root._slots is None, "last group out removes the placement groups"


def test_split_pool_and_verl_helper():
    pool = RayResourcePool([2, 1], use_gpu=False, cpus_per_process=0.5)
    assert pool.world_size == 3 and pool.bundle() == {"CPU": 0.5}
    with pytest.raises(ValueError):
        pool.split([2, 2])
    left, right = pool.split([2, 1])
    assert (left.world_size, right.world_size) == (2, 1)
    assert [p.world_size for p in split_resource_pool(RayResourcePool([4], use_gpu=False), 2)] == [2, 2]
    g1 = WorkerGroup(DataWorker, 2, backend="ray", resource_pool=left)
    g2 = WorkerGroup(DataWorker, 1, backend="ray", resource_pool=right)
    try:
        slots = pool.slots(10)
        assert len(slots) == 3
        got = [p["pg"] for p in g1.placement() + g2.placement()]
        assert got == [s.placement_group.id.hex() for s in slots]
        with pytest.raises(ValueError, match="pool has 2 ranks"):
            WorkerGroup(DataWorker, 3, backend="ray", resource_pool=left)
    finally:
        g1.shutdown()
        g2.shutdown()


def test_gpu_resources_are_fractional_by_construction():
    pool = RayResourcePool([4], use_gpu=True, max_colocate_count=3)
    assert pool.bundle() == {"CPU": 1.0, "GPU": 1.0}
    cpus, gpus = pool.actor_resources()
    assert gpus == pytest.approx(1 / 3) and cpus == pytest.approx(1 / 3)
    assert pool.actor_resources(0.25)[1] == 0.25
    with pytest.raises(ValueError, match="use_gpu=True"):
        RayResourcePool([1], use_gpu=False).actor_resources(1)


def test_colocated_roles_share_one_actor():
    cls = create_colocated_worker_cls({"counter": Counter, "doubler": Doubler})
    with WorkerGroup(cls, 2, backend="ray", init_kwargs={"counter": {"start": 10}}) as wg:
        roles = wg.spawn({"counter", "doubler"})
        assert roles["counter"].add(1) == [11, 11]
        assert roles["counter"].pid() == roles["doubler"].pid()
        out = roles["doubler"].double(DataProto.from_dict({"x": torch.arange(4)}))
        assert out.batch["x"].tolist() == [0, 2, 4, 6]


def test_detached_group_survives_its_handle_and_can_be_attached():
    name = "dispatchcore-test-detached"
    owner = WorkerGroup(Counter, 2, backend="ray", detached=True, name=name, init_kwargs={"start": 1})
    try:
        assert owner.add(1) == [2, 2]
        owner.shutdown()  # lets go of the handles; the actors live on
        other = attach_detached(name, Counter)
        assert other.world_size == 2
        assert other.add(5) == [7, 7]
        other.shutdown()
        verl_view = RayWorkerGroup.from_detached(name_prefix=name, ray_cls_with_init=RayClassWithInitArgs(Counter))
        assert verl_view.execute_all_sync("add", 1) == [8, 8]
        verl_view.shutdown()
    finally:
        assert kill_detached(name) == 2
    with pytest.raises(DispatchError, match="no detached ray group"):
        attach_detached("dispatchcore-test-missing", Counter)


def test_verl_shaped_driver():
    """A driver written against verl's single_controller.ray names, imports changed only."""
    resource_pool = RayResourcePool(process_on_nodes=[2], use_gpu=False, max_colocate_count=1, cpus_per_process=0.5)
    class_dict = {
        "actor": RayClassWithInitArgs(cls=ray.remote(Counter), start=3),
        "ref": RayClassWithInitArgs(cls=Doubler),
    }
    worker_dict_cls = create_colocated_worker_cls(class_dict=class_dict)
    wg_dict = RayWorkerGroup(resource_pool=resource_pool, ray_cls_with_init=RayClassWithInitArgs(worker_dict_cls))
    try:
        spawned = wg_dict.spawn(prefix_set=class_dict.keys())
        actor_wg, ref_wg = spawned["actor"], spawned["ref"]
        assert actor_wg.world_size == 2 and len(actor_wg.workers) == 2
        assert actor_wg.add(1) == [4, 4]
        assert actor_wg.execute_all_sync("add", [1, 2]) == [5, 6]
        refs = actor_wg.execute_all_async("add", 10)
        assert ray.get(refs) == [15, 16]
        assert ray.get(actor_wg.execute_rank_zero_async("add", 0)) == 15
        out = ref_wg.double(DataProto.from_dict({"x": torch.arange(6)}))
        assert out.batch["x"].tolist() == [0, 2, 4, 6, 8, 10]
    finally:
        wg_dict.shutdown()


def test_future_forwarded_between_groups_without_the_driver(monkeypatch):
    """The producer's results stay in the object store (``lane_inline_bytes=0``, as results past 8 MiB do)."""
    producer = WorkerGroup(EchoWorker, 3, backend="ray", lane_inline_bytes=0)
    consumer = WorkerGroup(EchoWorker, 2, backend="ray")
    try:
        forwarded = []
        real = consumer.executor.forward_chunk
        monkeypatch.setattr(consumer.executor, "forward_chunk", lambda h, plan: forwarded.append(1) or real(h, plan))
        for n in (6, 7, 1):
            data = batch(n, padding=True)
            future = producer.echo_later(data)
            pulled: list[int] = []
            real_get = future._resolve
            future._resolve = lambda t, real_get=real_get, pulled=pulled: pulled.append(1) or real_get(t)
            out = consumer.echo(future)
            assert not pulled, "the driver resolved the future"
            assert torch.equal(out.batch["x"], data.batch["x"])
            assert list(out.non_tensor_batch["s"]) == list(data.non_tensor_batch["s"])
            assert out.meta_info == future.get().meta_info
        assert len(forwarded) == 3 * consumer.world_size  # one chunk per consuming rank, each time
    finally:
        producer.shutdown()
        consumer.shutdown()


def test_on_the_lane_results_kept_in_the_object_store_are_forwarded_and_small_ones_resolved_on_the_driver(
    monkeypatch,
):
    """Results up to ``lane_inline_bytes`` come by the lane (the driver has them); larger ones stay in the store."""
    kept = WorkerGroup(EchoWorker, 2, backend="ray", lane_inline_bytes=0)  # every result kept: as past 8 MiB
    inline = WorkerGroup(EchoWorker, 2, backend="ray")
    consumer = WorkerGroup(EchoWorker, 2, backend="ray")
    try:
        forwarded = []
        real = consumer.executor.forward_chunk
        monkeypatch.setattr(consumer.executor, "forward_chunk", lambda h, plan: forwarded.append(1) or real(h, plan))
        for producer, rank_to_rank in ((kept, True), (inline, False)):
            forwarded.clear()
            data = batch(7, padding=True)
            out = consumer.echo(producer.echo_later(data))
            assert torch.equal(out.batch["x"], data.batch["x"])
            assert list(out.non_tensor_batch["s"]) == list(data.non_tensor_batch["s"])
            assert len(forwarded) == (consumer.world_size if rank_to_rank else 0)
    finally:
        for group in (kept, inline, consumer):
            group.shutdown()
