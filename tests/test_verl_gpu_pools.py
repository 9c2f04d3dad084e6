"""verl's GPU-asking defaults on a machine without GPUs (issue 23): Ray's GPUs are logical.

This module runs on its own local Ray started with ``num_gpus=2`` (the CPU
route for GPU-asking pools); the stand-in workers never touch CUDA.  It runs
in a pytest process of its own (``test_in_a_process_of_its_own``): shutting
the session's Ray down and starting another in the test process once made
Ray end that process on a loaded machine ("Failed to connect to GCS within
60 seconds" from a session shut down a second after it started), taking the
rest of the suite with it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ray = pytest.importorskip("ray")
cloudpickle = pytest.importorskip("cloudpickle")

from dispatchcore import Dispatch, Worker, register  # noqa: E402
from executors_ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup, ResourcePoolManager  # noqa: E402
from executors_ray.testing import TEST_NUM_CPUS  # noqa: E402

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _init(num_gpus: int | None) -> None:
    kwargs: dict[str, Any] = {"num_gpus": num_gpus} if num_gpus else {}
    ray.init(
        address="local",
        num_cpus=TEST_NUM_CPUS,
        include_dashboard=False,
        log_to_driver=False,
        namespace="dispatchcore-tests",
        **kwargs,
    )


#: Set in the child pytest process that runs this module's tests on a Ray of its own.
IN_CHILD = os.environ.get("DISPATCHCORE_GPU_POOLS_CHILD") == "1"


@pytest.fixture(scope="module", autouse=True)
def logical_gpus() -> Iterator[None]:
    if not IN_CHILD:  # the test process's Ray is left alone
        yield
        return
    _init(2)
    yield
    ray.shutdown()


@pytest.fixture(autouse=True)
def only_in_the_child(request: pytest.FixtureRequest) -> None:
    if not IN_CHILD and request.node.name != "test_in_a_process_of_its_own":
        pytest.skip("runs in a pytest process of its own (test_in_a_process_of_its_own)")


def test_in_a_process_of_its_own() -> None:
    if IN_CHILD:
        pytest.skip("the parent's test")
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "DISPATCHCORE_GPU_POOLS_CHILD": "1"}
    command = [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", str(Path(__file__).resolve())]
    result = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, timeout=170, check=False)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "3 passed" in result.stdout, result.stdout[-2000:]


class GpuStandIn(Worker):
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def gpu_ids(self) -> list[int]:
        return [int(i) for i in ray.get_gpu_ids()]


def test_verl_default_pool_places_on_logical_gpus_with_two_cpus_of_bundles() -> None:
    pool = RayResourcePool([2])  # use_gpu=True, max_colocate_count=10: verl's defaults
    wg = RayWorkerGroup(pool, RayClassWithInitArgs(ray.remote(GpuStandIn)), name_prefix="verl_gpu")
    try:
        assert wg.use_gpu is True
        assert pool.bundle() == {"CPU": 1.0, "GPU": 1.0}
        ids = wg.gpu_ids()
        assert len(ids) == 2 and all(len(i) == 1 for i in ids) and ids[0] != ids[1]
    finally:
        wg.shutdown()


def test_use_gpu_false_on_a_gpu_pool_asks_for_no_gpu() -> None:
    pool = RayResourcePool([1])
    wg = RayWorkerGroup(pool, RayClassWithInitArgs(GpuStandIn), use_gpu=False)
    try:
        assert wg.gpu_ids() == [[]]
    finally:
        wg.shutdown()


def test_resource_pool_manager_creates_verls_pools_and_groups_share_one() -> None:
    manager = ResourcePoolManager({"global_pool": [2]}, {"actor": "global_pool", "critic": "global_pool"})
    manager.create_resource_pool()
    pool = manager.get_resource_pool("actor")
    actor = RayWorkerGroup(pool, RayClassWithInitArgs(GpuStandIn), name_prefix="verl_mgr_a")
    critic = RayWorkerGroup(
        manager.get_resource_pool("critic"), RayClassWithInitArgs(GpuStandIn), name_prefix="verl_mgr_c"
    )
    try:
        assert actor.gpu_ids() == critic.gpu_ids()  # colocated: rank r of both on bundle r's GPU
        assert len(pool.pgs or []) == 1
    finally:
        actor.shutdown()
        critic.shutdown()
    with pytest.raises(ValueError, match="needs 4 GPU"):
        ResourcePoolManager({"a": [2], "b": [2]}, {}).create_resource_pool()
