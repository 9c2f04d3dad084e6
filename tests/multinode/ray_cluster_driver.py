"""A driver on a simulated three-node Ray cluster (one head, two labelled raylets on this machine).

Run as a script by ``tests/test_ray_multinode.py`` (a process joins one Ray,
so the cluster gets a process of its own); prints one JSON line of findings.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

import ray
import torch
import torch.distributed as dist
from ray.cluster_utils import Cluster

from dispatchcore import Dispatch, Worker, WorkerDiedError, WorkerGroup, register
from executors_ray import NODE_ORDER_LABEL, RayResourcePool

HEALTH_CHECK_PERIOD_MS = 500
HEALTH_CHECK_FAILURES = 3


class Spread(Worker):
    @register(Dispatch.ONE_TO_ALL)
    def where(self) -> dict[str, str]:
        return {
            "rank": str(self.rank),
            "node": ray.get_runtime_context().get_node_id(),
            "master_addr": os.environ["MASTER_ADDR"],
            "local_rank": os.environ["LOCAL_RANK"],
        }

    @register(Dispatch.ONE_TO_ALL)
    def all_reduce(self) -> float:
        if not dist.is_initialized():
            dist.init_process_group("gloo")
        t = torch.tensor([float(self.rank + 1)])
        dist.all_reduce(t)
        return float(t.item())

    @register(Dispatch.ONE_TO_ALL)
    def sleep(self, seconds: float) -> int:
        time.sleep(seconds)
        return self.rank


def main() -> None:
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 0,
            "include_dashboard": False,
            "_system_config": {
                "health_check_period_ms": HEALTH_CHECK_PERIOD_MS,
                "health_check_failure_threshold": HEALTH_CHECK_FAILURES,
            },
        },
    )
    # Added in reverse label order: the ranks must still follow the label, not the join order.
    second = cluster.add_node(num_cpus=2, labels={NODE_ORDER_LABEL: "1"})
    cluster.add_node(num_cpus=2, labels={NODE_ORDER_LABEL: "0"})
    ray.init(address=cluster.address)
    cluster.wait_for_nodes()
    labels = {n["NodeID"]: (n.get("Labels") or {}).get(NODE_ORDER_LABEL, "") for n in ray.nodes()}
    ips = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes()}
    found: dict[str, object] = {}
    pool = RayResourcePool([2, 2], use_gpu=False, cpus_per_process=1)
    death_timeout = 5.0
    wg = WorkerGroup(Spread, 4, backend="ray", resource_pool=pool, death_timeout=death_timeout)
    where = wg.where()
    found["order"] = [labels[w["node"]] for w in where]
    found["local_ranks"] = [w["local_rank"] for w in where]
    found["master_addr_is_rank0_node"] = all(w["master_addr"] == ips[where[0]["node"]] for w in where)
    found["all_reduce"] = wg.all_reduce()
    # Remove the node of ranks 2-3 while every rank is in a long call.
    doomed = next(n for n, label in labels.items() if label == "1")
    assert doomed == second.node_id
    died_at: list[float] = []

    def remove() -> None:
        time.sleep(1.0)
        died_at.append(time.monotonic())
        cluster.remove_node(second, allow_graceful=False)

    threading.Thread(target=remove, daemon=True).start()
    try:
        wg.sleep(600)
        found["error"] = None
    except WorkerDiedError as exc:
        found["error"] = str(exc)
        found["error_rank"] = exc.rank
        found["detect_s"] = round(time.monotonic() - died_at[0], 3)
    found["bound_s"] = death_timeout + HEALTH_CHECK_PERIOD_MS * HEALTH_CHECK_FAILURES / 1000
    found["doomed_node"] = doomed[:8]
    wg.shutdown()
    print(json.dumps(found), flush=True)
    ray.shutdown()
    cluster.shutdown()


if __name__ == "__main__":
    sys.exit(main())
