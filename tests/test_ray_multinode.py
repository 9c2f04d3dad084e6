"""Ray across nodes: a head plus two labelled raylets on this machine (``ray.cluster_utils.Cluster``).

A process joins one Ray, so the cluster and its driver run in a subprocess
(``tests/multinode/ray_cluster_driver.py``), which reports what it saw.
Every raylet shares this machine's IP and node IDs change per run, so ranks
follow the ``NODE_ORDER_LABEL`` label after the IP (a real cluster: the IP).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ray")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

DRIVER = Path(__file__).parent / "multinode" / "ray_cluster_driver.py"


@pytest.fixture(scope="module")
def findings() -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    done = subprocess.run([sys.executable, str(DRIVER)], capture_output=True, text=True, timeout=280, env=env)
    assert done.returncode == 0, done.stderr[-4000:]
    line = [ln for ln in done.stdout.splitlines() if ln.startswith("{")][-1]
    return json.loads(line)


def test_pool_spreads_ranks_over_nodes_in_label_order(findings: dict[str, object]) -> None:
    assert findings["order"] == ["0", "0", "1", "1"]  # nodes joined in the other order
    assert findings["local_ranks"] == ["0", "1", "0", "1"]
    assert findings["master_addr_is_rank0_node"] is True


def test_gloo_all_reduce_across_nodes(findings: dict[str, object]) -> None:
    assert findings["all_reduce"] == [10.0, 10.0, 10.0, 10.0]


def test_removing_a_node_mid_call_names_rank_and_node(findings: dict[str, object]) -> None:
    """Every rank is in a 600 s call: only prompt detection ends it (bound: death_timeout + health checks)."""
    assert findings["error_rank"] in (2, 3)
    error = str(findings["error"])
    assert "died while running 'sleep'" in error and f"({findings['doomed_node']})" in error
