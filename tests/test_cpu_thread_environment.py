"""How many intra-op threads a rank process that shares its host gets."""

from __future__ import annotations

import os

from dispatchcore.executor import cpu_thread_environment


def test_ranks_sharing_a_host_split_its_cores() -> None:
    cores = len(os.sched_getaffinity(0))
    assert cpu_thread_environment(2, environ={}) == {"OMP_NUM_THREADS": str(max(1, cores // 2))}
    assert cpu_thread_environment(4 * cores, environ={}) == {"OMP_NUM_THREADS": "1"}


def test_a_rank_alone_on_its_host_keeps_torch_default() -> None:
    assert cpu_thread_environment(1, environ={}) == {}


def test_the_users_own_setting_wins() -> None:
    assert cpu_thread_environment(8, environ={"OMP_NUM_THREADS": "3"}) == {}
