"""Unit test of an internal part (the process's buffer pool): imports dispatchcore._wire._buffers directly.

The pool of large host buffers: reuse only what nothing can see, bounded idle memory.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import torch
from hypothesis import given
from hypothesis import strategies as st

from dispatchcore._wire._buffers import POOL_MIN_BYTES, BufferPool, size_class
from dispatchcore.wire import numpy_tensor

MB = 1 << 20


def address(a: np.ndarray) -> int:
    return int(a.__array_interface__["data"][0])


@given(st.integers(1, 1 << 40))
def test_size_classes_waste_at_most_an_eighth(nbytes: int) -> None:
    cls = size_class(nbytes)
    assert nbytes <= cls <= nbytes + max(1, nbytes // 8) + 1
    assert size_class(cls) == cls


def test_a_buffer_comes_back_only_when_nothing_sees_it() -> None:
    pool = BufferPool(idle_limit=64 * MB)
    first = pool.take(3 * MB)
    kept = torch.from_numpy(first)[100:200]  # a view made from it keeps it out of the pool
    where = address(first)
    del first
    second = pool.take(3 * MB)
    assert address(second) != where and pool.reused == 0
    kept.fill_(7)
    assert not np.shares_memory(second, kept.numpy())
    del kept
    third = pool.take(3 * MB)
    assert address(third) == where and pool.reused == 1
    assert third.nbytes == 3 * MB and third.flags.writeable


def test_numpy_tensors_recycle_through_the_process_pool() -> None:
    t = numpy_tensor((MB,), torch.float32)
    where = t.data_ptr()
    t.fill_(1.0)
    del t
    again = numpy_tensor((MB,), torch.float32)
    assert again.data_ptr() == where  # same class, freed: reused (no fresh pages)


def test_small_requests_are_not_pooled() -> None:
    pool = BufferPool(idle_limit=64 * MB)
    small = pool.take(POOL_MIN_BYTES - 1)
    del small
    assert pool.idle_bytes() == 0


def test_idle_memory_stays_under_the_limit_and_expires() -> None:
    pool = BufferPool(idle_limit=5 * MB)
    buffers = [pool.take(2 * MB) for _ in range(4)]
    del buffers
    assert 0 < pool.idle_bytes() <= 5 * MB
    expiring = BufferPool(idle_limit=64 * MB, idle_seconds=0.0)
    one = expiring.take(2 * MB)
    del one
    expiring.take(4 * MB)  # any later request lets idle buffers past their time go
    assert expiring.idle_bytes() == 0


def test_a_limit_of_zero_turns_the_pool_off() -> None:
    pool = BufferPool(idle_limit=0)
    buffer = pool.take(4 * MB)
    del buffer
    assert pool.idle_bytes() == 0 and pool.reused == 0


def test_a_bad_limit_in_the_environment_says_what_to_write() -> None:
    code = "import dispatchcore._wire._buffers"
    env = {"DISPATCHCORE_BUFFER_POOL_MB": "lots", "PATH": ""}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False)
    assert proc.returncode != 0
    assert "DISPATCHCORE_BUFFER_POOL_MB must be a whole number of MiB" in proc.stderr


def test_threads_taking_and_freeing_at_once_keep_the_books_straight() -> None:
    import threading

    pool = BufferPool(idle_limit=16 * MB)

    def churn(seed: int) -> None:
        rng = np.random.default_rng(seed)
        held = []
        for _ in range(200):
            buffer = pool.take(int(rng.integers(MB, 4 * MB)))
            buffer[:1] = seed  # each buffer is private to its taker
            held.append(buffer)
            if len(held) > 3:
                first = held.pop(0)
                assert int(first[0]) == seed
                del first

    threads = [threading.Thread(target=churn, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert 0 < pool.idle_bytes() <= 16 * MB
    assert pool.reused > 0
