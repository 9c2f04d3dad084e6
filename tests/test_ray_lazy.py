"""Lazy results on Ray; one check probes an internal part (an actor's rows group): imports executors_ray._tags.

Rows move actor to actor, never through the driver (one local Ray for the run).  :func:`held_on` asks a rank
actor directly, in its rows concurrency group, whether it still keeps a key (beside a running call).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch

pytest.importorskip("ray")

import ray  # noqa: E402

from _freeze import freeze  # noqa: E402
from dispatchcore import DataProto, LazyDataProto, WorkerDiedError, WorkerGroup, driver_traffic  # noqa: E402
from dispatchcore.executor import RowRequest  # noqa: E402
from dispatchcore.testing import assert_dataproto_equal  # noqa: E402
from executors_ray._tags import OK_PACKED, ROWS_GROUP  # noqa: E402
from executors_ray.testing import ray_session  # noqa: E402, F401
from ray_workers import RowsWorker  # noqa: E402

pytestmark = [pytest.mark.usefixtures("ray_session"), pytest.mark.timeout(60)]

#: Short enough to keep the hung-producer case quick, long enough for pings on a loaded machine.
DEATH_TIMEOUT = 5.0


def prompts(n: int, width: int = 6) -> DataProto:
    return DataProto.from_dict({"x": torch.arange(n)}, meta_info={"width": width}, auto_padding=True)


@pytest.fixture(scope="module")
def producer(ray_session: Any) -> Iterator[WorkerGroup[RowsWorker]]:  # noqa: F811
    wg = WorkerGroup(RowsWorker, 2, backend="ray", death_timeout=DEATH_TIMEOUT)
    yield wg
    wg.shutdown()


@pytest.fixture(scope="module")
def consumer(ray_session: Any) -> Iterator[WorkerGroup[RowsWorker]]:  # noqa: F811
    wg = WorkerGroup(RowsWorker, 3, backend="ray", death_timeout=DEATH_TIMEOUT)
    yield wg
    wg.shutdown()


@pytest.fixture
def fresh_producer(ray_session: Any) -> Iterator[WorkerGroup[RowsWorker]]:  # noqa: F811
    """A producer a test may kill, stop or keep busy."""
    wg = WorkerGroup(RowsWorker, 2, backend="ray", death_timeout=DEATH_TIMEOUT)
    yield wg
    wg.shutdown()


def payload_bytes(data: DataProto) -> int:
    return sum(t.numel() * t.element_size() for t in data.batch.values())


def test_a_consuming_group_can_fetch_from_any_ray_group_of_this_driver(producer: Any, consumer: Any) -> None:
    address = producer.executor.row_address(1)
    assert consumer.executor.can_fetch_rows(address)
    assert producer.executor.can_fetch_rows(consumer.executor.row_address(0))
    assert not consumer.executor.can_fetch_rows(None)  # another backend's (or no) address: through the driver


def test_lazy_chain_gives_the_eager_rows_with_padding(producer: Any, consumer: Any) -> None:
    data = prompts(10)  # 2 producing ranks of 5 rows; 3 consuming ranks of 4, the last with 2 padding rows
    eager, lazy = producer.gen(data), producer.gen.options(lazy=True)(data)
    assert isinstance(lazy, LazyDataProto)
    expected = consumer.echo(eager)
    assert_dataproto_equal(consumer.echo(lazy), expected)
    assert consumer.echo(lazy).batch["rank"].tolist() == [0] * 4 + [1] * 4 + [2] * 2
    assert_dataproto_equal(consumer.echo.options(lazy=True)(lazy), expected)  # lazy into lazy
    assert_dataproto_equal(producer.echo(consumer.echo.options(lazy=True)(lazy)), producer.echo(expected))


def test_rows_move_rank_to_rank_not_through_the_driver(producer: Any, consumer: Any) -> None:
    data = prompts(512, width=256)
    eager = producer.gen(data)
    payload = payload_bytes(eager)  # ~1.5 MB of tokens and log-probs
    lazy = producer.gen.options(lazy=True)(data)
    before = driver_traffic()
    lazy_sums = consumer.checksum(lazy)
    moved = driver_traffic() - before
    assert moved.sent_bytes == 0  # no driver-side column: only references went out
    assert moved.total < payload / 100, (moved, payload)  # back: one float per row
    before = driver_traffic()
    eager_sums = consumer.checksum(eager)
    assert (driver_traffic() - before).sent_bytes >= payload  # the counter sees rows that do cross
    assert torch.equal(lazy_sums.batch["sum"], eager_sums.batch["sum"])


def test_column_read_fetches_that_column_only(producer: Any) -> None:
    data = prompts(64, width=128)
    lazy = producer.gen.options(lazy=True)(data)
    before = driver_traffic()
    reward = lazy.batch["reward"]
    moved = driver_traffic() - before
    assert moved.sent_bytes == 0
    assert moved.received_bytes == reward.numel() * reward.element_size()
    assert torch.equal(reward, producer.gen(data).batch["reward"])
    assert list(lazy.non_tensor_batch["uid"][:2]) == ["u0", "u1"]


def test_union_select_and_concat_of_lazy_and_local_parts(producer: Any, consumer: Any) -> None:
    data = prompts(12)
    lazy, eager = producer.gen.options(lazy=True)(data), producer.gen(data)
    adv = DataProto.from_dict({"adv": torch.arange(12, dtype=torch.float32) * 3})
    mixed = lazy.select(["tokens", "logp"], ["uid"]).union(adv)
    plain = eager.select(["tokens", "logp"], ["uid"]).union(adv)
    before = driver_traffic()
    out = consumer.echo(mixed)
    sent = (driver_traffic() - before).sent_bytes
    assert sent == payload_bytes(adv)  # the driver-side column, not the kept ones
    assert_dataproto_equal(out, consumer.echo(plain))
    joined = DataProto.concat([mixed[3:9], plain[:4], mixed[9:]])
    assert isinstance(joined, LazyDataProto)
    assert_dataproto_equal(consumer.echo(joined), consumer.echo(DataProto.concat([plain[3:9], plain[:4], plain[9:]])))


def test_a_killed_producer_gives_worker_died_naming_it(fresh_producer: Any, consumer: Any) -> None:
    lazy = fresh_producer.gen.options(lazy=True)(prompts(12))
    ray.kill(fresh_producer.executor.actor(1), no_restart=True)
    with pytest.raises(WorkerDiedError) as consumed:
        consumer.echo(lazy)  # the consumers fetch from the dead actor
    assert consumed.value.rank == 1
    with pytest.raises(WorkerDiedError) as read:
        lazy.batch["tokens"]  # the driver reads from it
    assert read.value.rank == 1
    assert consumer.pid()  # the consuming group is unharmed


def test_a_hung_producer_is_seen_within_death_timeout(fresh_producer: Any, consumer: Any) -> None:
    """The producer is stopped for good: only the consumers' bounded wait lets the call end."""
    lazy = fresh_producer.gen.options(lazy=True)(prompts(12))
    pid = fresh_producer.pid()[1]
    freeze(pid)
    try:
        with pytest.raises(WorkerDiedError, match="death_timeout") as info:
            consumer.echo(lazy)
        assert info.value.rank == 1
    finally:
        os.kill(pid, signal.SIGKILL)


def test_freed_rows_leave_the_producer(producer: Any) -> None:
    lazy = producer.gen.options(lazy=True)(prompts(8))
    keys = [source.held.key for source in lazy.remote_sources()]
    assert [any(held) for held in producer.holds(keys)] == [True, True]
    del lazy
    producer.pid()  # frees go out with the group's next call, ahead of it
    assert producer.holds(keys) == [[False, False], [False, False]]


def held_on(actor: Any, key: str) -> bool:
    """Whether ``actor`` keeps ``key``, asked in its rows group (beside a running call)."""
    request = RowRequest(None, 0, key, (), slice(0, 0))
    tag, _ = ray.get(actor.take_rows.options(concurrency_group=ROWS_GROUP).remote([request]), timeout=30)
    return bool(tag == OK_PACKED)


def test_a_busy_producer_serves_rows_and_frees(fresh_producer: Any, consumer: Any) -> None:
    """Rank calls far longer than the test's timeout: only the rows group lets this pass."""
    data = prompts(12)
    first, second = fresh_producer.gen.options(lazy=True)(data), fresh_producer.gen.options(lazy=True)(data)
    expected = fresh_producer.gen(data)
    busy = fresh_producer.sleep_later(3600)
    assert_dataproto_equal(consumer.echo(first), consumer.echo(expected))  # consumers fetch from it
    actor, key = fresh_producer.executor.actor(0), first.remote_sources()[0].held.key
    assert held_on(actor, key)
    del first
    assert torch.equal(second.batch["logp"], expected.batch["logp"])  # a driver read (it sends the frees too)
    for _ in range(100):  # the free and this probe both run in the rows group, in either order
        if not held_on(actor, key):
            break
        time.sleep(0.05)
    else:
        pytest.fail(f"{key} still held after its free")
    assert not busy.done()
    assert np.array_equal(second.non_tensor_batch["uid"], expected.non_tensor_batch["uid"])
