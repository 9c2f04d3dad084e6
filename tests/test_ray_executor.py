"""The ray backend: environment, data path, isolation, failures, placement."""

from __future__ import annotations

import subprocess
import sys
import time

import numpy as np
import pytest
import torch

ray = pytest.importorskip("ray")

from dispatchcore import (  # noqa: E402
    DataProto,
    DispatchError,
    DispatchTimeoutError,
    WorkerDiedError,
    WorkerError,
    WorkerGroup,
)
from executors_ray import PlacementError, PlacementTimeoutError, RayResourcePool  # noqa: E402
from executors_ray.testing import ray_session  # noqa: E402, F401
from ray_workers import BadInit, DataWorker, EnvWorker  # noqa: E402

pytestmark = [pytest.mark.usefixtures("ray_session"), pytest.mark.timeout(120)]


@pytest.fixture
def groups():
    made: list[WorkerGroup] = []

    def make(cls, n, **kw):
        wg = WorkerGroup(cls, n, backend="ray", **kw)
        made.append(wg)
        return wg

    yield make
    for wg in made:
        wg.shutdown()


@pytest.fixture(scope="module")
def data2(ray_session):  # noqa: F811
    wg = WorkerGroup(DataWorker, 2, backend="ray", init_kwargs={"offset": 5})
    yield wg
    wg.shutdown()


def test_plugin_imports_no_ray():
    code = (
        "import sys, dispatchcore, executors_ray, executors_ray.plugin; "
        "assert 'ray' not in sys.modules, 'ray imported'; print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "ray" in __import__("dispatchcore").available_backends()


def test_environment_and_gloo_all_reduce(groups):
    wg = groups(EnvWorker, 2, env={"EXTRA": "yes"})
    envs = wg.environment()
    assert [e["RANK"] for e in envs] == ["0", "1"]
    assert [e["self_rank"] for e in envs] == [0, 1]
    assert {e["WORLD_SIZE"] for e in envs} == {"2"}
    assert [e["LOCAL_RANK"] for e in envs] == ["0", "1"]
    assert {e["LOCAL_WORLD_SIZE"] for e in envs} == {"2"}
    assert len({(e["MASTER_ADDR"], e["MASTER_PORT"]) for e in envs}) == 1
    assert int(envs[0]["MASTER_PORT"]) > 0
    assert {e["EXTRA"] for e in envs} == {"yes"}
    assert len({e["pid"] for e in envs}) == 2
    assert wg.all_reduce(2.0) == [6.0, 6.0]  # 2*1 + 2*2 on both ranks


def test_bad_options():
    with pytest.raises(ValueError, match="MASTER_PORT"):
        WorkerGroup(EnvWorker, 2, backend="ray", env={"MASTER_PORT": "1"})
    with pytest.raises(TypeError, match="unknown option"):
        WorkerGroup(EnvWorker, 2, backend="ray", bogus=1)


def test_dp_echo_padding_and_object_column(data2):
    x = torch.arange(21).reshape(7, 3)
    words = np.array([f"w{i}" for i in range(7)], dtype=object)
    batch = DataProto.from_dict({"x": x}, {"words": words}, meta_info={"k": 1}, auto_padding=True)
    out = data2.echo(batch)
    assert torch.equal(out.batch["x"], x)
    assert list(out.non_tensor_batch["words"]) == list(words)
    assert out.meta_info["k"] == 1
    assert torch.equal(data2.add_offset(DataProto.from_dict({"x": torch.arange(4)})).batch["x"], torch.arange(4) + 5)


def test_isolation_rank_zero_mutates(data2):
    x = torch.arange(8).reshape(4, 2)
    extra = torch.zeros(1, 3, dtype=torch.int64)
    out = data2.mutate(DataProto.from_dict({"x": x.clone()}), extra)
    assert torch.equal(out.batch["x"][:2], x[:2] + 1000)  # rank 0 saw its own write
    assert torch.equal(out.batch["x"][2:], x[2:])  # rank 1's chunk untouched
    assert torch.equal(out.batch["extra"][:2], torch.full((2, 3), 1000))
    assert torch.equal(out.batch["extra"][2:], torch.zeros(2, 3, dtype=torch.int64))  # rank 1 saw the original
    assert torch.equal(extra, torch.zeros(1, 3, dtype=torch.int64))  # the driver's too
    big = torch.zeros(64 * 1024, dtype=torch.int64)  # large: ray.put once, shared memory
    assert data2.shared_write(big) == [7, 0]
    assert int(big[0]) == 0


#: Large values in the object store, as the lane sends them past 8 MiB (a small bound here keeps the test cheap).
STORE = {"lane_inline_bytes": 1024}


def test_isolate_false_hands_shared_buffers(groups):
    wg = groups(DataWorker, 2, isolate=False, **STORE)
    big = torch.zeros(64 * 1024, dtype=torch.int64)
    assert wg.shared_write(big) == [7, 7]  # one object-store copy seen by both ranks: do not write
    assert int(big[0]) == 0


def test_broadcast_is_put_once(groups, monkeypatch):
    data2 = groups(DataWorker, 2, init_kwargs={"offset": 5}, **STORE)
    executor = data2.executor
    puts = []
    real_put = executor.ray.put
    monkeypatch.setattr(executor.ray, "put", lambda v, **kw: puts.append(1) or real_put(v, **kw))
    big = torch.ones(64 * 1024, dtype=torch.int64)
    assert data2.shared_write(big) == [7, 1]
    assert len(puts) == 1


def test_large_chunks_share_one_put_and_stay_isolated(groups, monkeypatch):
    data2 = groups(DataWorker, 2, init_kwargs={"offset": 5}, **STORE)
    executor = data2.executor
    assert executor._bulk.bundle  # a local Ray: every rank on the driver's node
    puts = []
    real_put = executor.ray.put
    monkeypatch.setattr(executor.ray, "put", lambda v, **kw: puts.append(1) or real_put(v, **kw))
    x = torch.arange(4 * 32 * 1024).reshape(4, -1)  # 512 KB per chunk: not inlined
    sent = x.clone()
    extra = torch.zeros(1, 3, dtype=torch.int64)
    out = data2.mutate(DataProto.from_dict({"x": sent}), extra)
    assert len(puts) == 1  # both ranks' chunks in one object
    assert torch.equal(out.batch["x"][:2], x[:2] + 1000)  # rank 0 wrote into its own copy
    assert torch.equal(out.batch["x"][2:], x[2:])  # rank 1's chunk untouched
    assert torch.equal(sent, x)  # and the driver's batch too


def test_atoms_tuples_and_unregistered_methods(data2):
    assert data2.pid() != data2.fail(5)  # atoms come back as they are
    assert data2.execute_all("pid") == data2.pid()  # registered
    with pytest.raises(WorkerError, match="registered no mesh"):  # not registered
        data2.execute_all("query_collect_info", "no-mesh")
    assert data2.execute_all("_register_dispatch_collect_info", "m", 0, True) == [None, None]
    assert data2.mesh_ranks("m") == [(0, True), (0, True)]  # the core's mesh query: an operation, no method


def test_worker_error_keeps_group_usable(data2):
    with pytest.raises(WorkerError) as info:
        data2.fail(1)
    assert info.value.rank == 1 and info.value.method == "fail"
    assert "planted failure on rank 1" in str(info.value)
    assert "ValueError" in info.value.remote_traceback
    assert data2.fail(5) == [0, 1]


def test_init_failure_raises_worker_error():
    with pytest.raises(WorkerError) as info:
        WorkerGroup(BadInit, 2, backend="ray")
    assert info.value.rank == 1 and info.value.method == "__init__"


@pytest.mark.timeout(90)  # the bound: the death is reported, the call never hangs
@pytest.mark.parametrize("how", ["exit", "kill"])
def test_dead_actor_gives_worker_died_error(groups, how):
    wg = groups(DataWorker, 2, death_timeout=10)
    with pytest.raises(WorkerDiedError) as info:
        wg.die(1, how)
    assert info.value.rank == 1 and "rank1" in str(info.value)
    with pytest.raises(DispatchError, match="no more calls"):
        wg.pid()
    wg.shutdown()


@pytest.mark.timeout(90)  # far below the 600 s sleep: the call and shutdown never wait it out
def test_call_timeout(groups):
    wg = groups(DataWorker, 2)
    with pytest.raises(DispatchTimeoutError, match="sleep"):
        wg.sleep.options(timeout=0.5)(600)
    wg.shutdown()


@pytest.mark.timeout(90)  # the bound: unplaceable groups fail instead of waiting forever
def test_unplaceable_group_raises_after_start_timeout():
    with pytest.raises(PlacementTimeoutError, match="start_timeout") as unplaced:
        WorkerGroup(DataWorker, 2, backend="ray", num_gpus=1, start_timeout=2)
    # A start-up past its bound, as on every backend: caught as a timeout, and still a PlacementError.
    assert isinstance(unplaced.value, DispatchTimeoutError) and isinstance(unplaced.value, PlacementError)
    with pytest.raises(PlacementTimeoutError, match="could not be placed"):
        WorkerGroup(
            DataWorker,
            2,
            backend="ray",
            start_timeout=2,
            resource_pool=RayResourcePool([2], use_gpu=False, cpus_per_process=64),
        )


def test_shutdown_kills_actors_and_is_idempotent():
    wg = WorkerGroup(DataWorker, 2, backend="ray")
    name = wg.executor.actor_name(0)
    assert ray.get_actor(name) is not None
    wg.shutdown()
    wg.shutdown()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            ray.get_actor(name)
        except ValueError:
            break
        time.sleep(0.2)
    else:
        pytest.fail("actor still registered after shutdown")
    with pytest.raises(DispatchError):
        wg.pid()
