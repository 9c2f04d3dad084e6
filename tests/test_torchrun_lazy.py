"""Lazy results on the torchrun backend: rows move rank to rank, never through the driver.

Self-started worlds (``backend="torchrun"`` outside a launch): each group has
its own processes, so two roles of a colocated class (``spawn``) are the way
to have two groups in one world.  Groups of different self-started worlds
move rows over bridges, with the same result.
"""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch

from _freeze import freeze
from dispatchcore import (
    DataProto,
    Dispatch,
    DispatchError,
    Worker,
    WorkerDiedError,
    WorkerGroup,
    available_backends,
    create_colocated_worker_cls,
    driver_traffic,
    register,
)
from dispatchcore.executor import Call, Instructions, Operation, RowAccess, RowRequest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


class Gen(Worker):
    """Makes rows: a wide int64 column (the payload), a small float column, a string column."""

    @register(Dispatch.DP_COMPUTE_PROTO)
    def gen(self, prompts: DataProto) -> DataProto:
        ids = prompts.batch["ids"]
        width = int(prompts.meta_info["width"])
        big = ids[:, None] * 1000 + torch.arange(width)[None, :]
        labels = np.array([f"row{i}" for i in ids.tolist()], dtype=object)
        return DataProto.from_dict({"big": big, "small": ids.float() / 2}, {"label": labels}, auto_padding=True)

    @register(Dispatch.ONE_TO_ALL)
    def pid(self) -> int:
        return os.getpid()

    @register(Dispatch.ONE_TO_ALL, blocking=False)
    def sleep_later(self, seconds: float) -> None:
        time.sleep(seconds)


class Use(Worker):
    """Consumes rows: returns a small digest of every column, and which rank saw each row."""

    @register(Dispatch.DP_COMPUTE_PROTO)
    def use(self, data: DataProto) -> DataProto:
        out = {name: (t.sum(dim=1) if t.dim() > 1 else t.clone()) for name, t in data.batch.items()}
        out["seen_by"] = torch.full((len(data),), self.rank)
        return DataProto.from_dict(out, {"label": data.non_tensor_batch["label"].copy()})


Colocated = create_colocated_worker_cls({"gen": Gen, "use": Use})


def prompts(rows: int, width: int) -> DataProto:
    return DataProto.from_dict({"ids": torch.arange(rows)}, meta_info={"width": width})


def assert_same(got: DataProto, want: DataProto) -> None:
    assert len(got) == len(want)
    assert sorted(got.batch.keys()) == sorted(want.batch.keys())
    for name in want.batch.keys():
        assert torch.equal(got.batch[name], want.batch[name]), name
    assert sorted(got.non_tensor_batch) == sorted(want.non_tensor_batch)
    for name, column in want.non_tensor_batch.items():
        assert np.array_equal(got.non_tensor_batch[name], column), name


@pytest.fixture(scope="module")
def roles() -> Iterator[dict[str, Any]]:
    """One self-started world of 3 processes hosting both roles; ``gen`` runs on 2 of them."""
    if "torchrun" not in available_backends():
        pytest.skip("torchrun backend unavailable")
    wg = WorkerGroup(Colocated, 3, backend="torchrun")
    try:
        spawned = wg.spawn(["gen", "use"])
        yield {"gen": spawned["gen"][0:2], "use": spawned["use"]}
    finally:
        wg.shutdown()


def test_lazy_chain_with_padding_gives_the_eager_rows(roles: dict[str, Any]) -> None:
    gen, use = roles["gen"], roles["use"]
    batch = prompts(10, 16)  # 2 x 5 rows made; 3 consumers get 4 rows each, 2 of them padding
    eager = use.use(gen.gen(batch))
    lazy = gen.gen.options(lazy=True)(batch)
    assert_same(use.use(lazy), eager)
    # Consumers in reverse order: every consuming rank's rows live in another process, and rank 2's
    # process both fetches from and serves to rank 0's while both run their part of the call.
    reverse = use.ranks([2, 1, 0])
    assert_same(reverse.use(lazy), reverse.use(gen.gen(batch)))
    # A driver-side column written between the calls travels with the references.
    lazy.batch["adv"] = torch.arange(len(lazy), dtype=torch.float32) * 3
    plain = gen.gen(batch)
    plain.batch["adv"] = torch.arange(len(plain), dtype=torch.float32) * 3
    assert_same(reverse.use(lazy), reverse.use(plain))


def test_rows_go_rank_to_rank_not_through_the_driver(roles: dict[str, Any]) -> None:
    gen, use = roles["gen"].gen, roles["use"].ranks([2, 1, 0]).use
    lazy = gen.options(lazy=True)(prompts(1024, 1024))  # 8 MiB of payload
    payload = len(lazy) * 1024 * 8
    before = driver_traffic()
    out = use(lazy)
    moved = driver_traffic() - before
    # Only the small results came back; the payload went from the producers' processes to the consumers'.
    assert moved.sent_bytes == 0
    assert moved.total < payload / 100, moved
    assert torch.equal(out.batch["big"], gen(prompts(1024, 1024)).batch["big"].sum(dim=1))


def test_reading_a_column_on_the_driver_fetches_that_column_only(roles: dict[str, Any]) -> None:
    lazy = roles["gen"].gen.options(lazy=True)(prompts(64, 512))
    before = driver_traffic()
    small = lazy.batch["small"]
    moved = driver_traffic() - before
    assert torch.equal(small, torch.arange(64).float() / 2)
    assert moved.received_bytes == small.numel() * small.element_size()
    assert moved.sent_bytes == 0


def test_groups_of_different_worlds_move_rows_over_bridges(roles: dict[str, Any]) -> None:
    """A group of its own self-started world fetches the roles' rows over bridges: none cross the driver."""
    with WorkerGroup(Use, 3, backend="torchrun") as other:
        batch = prompts(10, 1024)  # 2 x 5 rows made, 3 consumers of 4 rows (2 of them padding): 80 KiB
        lazy = roles["gen"].gen.options(lazy=True)(batch)
        before = driver_traffic()
        out = other.use(lazy)
        moved = driver_traffic() - before
        assert_same(out, other.use(roles["gen"].gen(batch)))
        assert moved.sent_bytes == 0, moved
        assert moved.total < len(lazy) * 1024 * 8 / 4, moved  # only the small digests came back
        # Again, in reverse and with a driver-side column: the bridges built by the first call are reused.
        reverse = other.ranks([2, 1, 0])
        lazy.batch["adv"] = torch.arange(len(lazy), dtype=torch.float32) * 3
        plain = roles["gen"].gen(batch)
        plain.batch["adv"] = torch.arange(len(plain), dtype=torch.float32) * 3
        assert_same(reverse.use(lazy), reverse.use(plain))


@pytest.mark.timeout(90)
def test_a_producer_killed_while_another_world_fetches_is_named_and_replaced() -> None:
    """SIGKILL a (frozen) producer while a consumer of another world waits on it: the call names it at once.

    The consumer's ``death_timeout`` (600 s) is far past this test's timeout, so only the producing
    world's dead mark can end the fetch before it: passing proves the bound.  The replaced rank serves
    from a new process (new bridges); once the producing group is shut down its rows cannot be read,
    and the error says so.
    """
    if "torchrun" not in available_backends():
        pytest.skip("torchrun backend unavailable")
    with WorkerGroup(Use, 1, backend="torchrun", death_timeout=600.0) as consumer:
        with WorkerGroup(Gen, 2, backend="torchrun", spare_ranks=1) as producer:
            batch = prompts(8, 32)
            lazy = producer.gen.options(lazy=True)(batch)
            assert_same(consumer.use(lazy), consumer.use(producer.gen(batch)))  # bridges to both producers
            pid = producer.pid()[1]
            freeze(pid)
            outcome: dict[str, BaseException] = {}

            def consume() -> None:
                try:
                    consumer.use(lazy)
                except BaseException as exc:  # noqa: BLE001 - the outcome under test
                    outcome["error"] = exc

            caller = threading.Thread(target=consume, daemon=True)
            caller.start()
            caller.join(0.5)  # the fetch waits on the frozen producer
            os.kill(pid, signal.SIGKILL)
            caller.join()  # bounded by the test's timeout, not by death_timeout
            error = outcome.get("error")
            assert isinstance(error, WorkerDiedError), outcome
            assert error.rank == 1
            producer.replace_rank(1)
            assert producer.pid()[1] != pid
            fresh = producer.gen.options(lazy=True)(batch)
            assert_same(consumer.use(fresh), consumer.use(producer.gen(batch)))
        with pytest.raises(DispatchError):
            consumer.use(fresh)


@pytest.mark.timeout(90)
def test_producer_death_fails_the_consuming_call_naming_the_producer() -> None:
    """A frozen producer (its lane pings unanswered), then a killed one: each consuming call raises WorkerDiedError.

    The producer never recovers (SIGSTOP, then SIGKILL), so without detection the consuming
    call would wait past this test's timeout: passing proves the bound.
    """
    if "torchrun" not in available_backends():
        pytest.skip("torchrun backend unavailable")
    with WorkerGroup(Colocated, 2, backend="torchrun", death_timeout=1.0) as wg:
        spawned = wg.spawn(["gen", "use"])
        lazy = spawned["gen"].gen.options(lazy=True)(prompts(8, 32))
        producer = spawned["gen"].pid()[1]
        consumer = spawned["use"].ranks([0]).use  # needs rank 1's rows, kept in the other process
        freeze(producer)
        try:
            with pytest.raises(WorkerDiedError) as frozen:
                consumer(lazy)
            assert frozen.value.rank == 1
            assert "liveness ping" in str(frozen.value)
        finally:
            os.kill(producer, signal.SIGKILL)
        with pytest.raises(WorkerDiedError) as killed:
            consumer(lazy)
        assert killed.value.rank == 1


@pytest.mark.timeout(90)
def test_shutdown_ends_a_call_stuck_fetching_rows() -> None:
    """The producer is frozen and the group's death_timeout is long: only shutdown can end the fetch.

    The consuming call (on a driver thread) must end, with an error, once the group is shut down;
    joined without a bound, so a hang fails by this test's timeout.
    """
    if "torchrun" not in available_backends():
        pytest.skip("torchrun backend unavailable")
    wg = WorkerGroup(Colocated, 2, backend="torchrun", death_timeout=600.0)
    try:
        spawned = wg.spawn(["gen", "use"])
        lazy = spawned["gen"].gen.options(lazy=True)(prompts(8, 32))
        producer = spawned["gen"].pid()[1]
        consumer = spawned["use"].ranks([0]).use
        freeze(producer)
        outcome: dict[str, BaseException] = {}

        def consume() -> None:
            try:
                consumer(lazy)
            except BaseException as exc:  # noqa: BLE001 - the outcome under test
                outcome["error"] = exc

        caller = threading.Thread(target=consume, daemon=True)
        caller.start()
        caller.join(1.0)  # let the fetch start (if it has not, shutdown refuses or ends the call all the same)
        wg.shutdown()
        caller.join()
        assert isinstance(outcome.get("error"), DispatchError), outcome
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(producer, signal.SIGKILL)
        wg.shutdown()


@pytest.mark.timeout(90)
def test_a_busy_producer_serves_driver_reads_and_frees() -> None:
    """Rank 1 sleeps far past this test's timeout: only reads and frees beside its call let this pass."""
    if "torchrun" not in available_backends():
        pytest.skip("torchrun backend unavailable")
    with WorkerGroup(Colocated, 2, backend="torchrun") as wg:
        gen = wg.spawn(["gen"])["gen"]
        batch = prompts(8, 16)
        first, second = gen.gen.options(lazy=True)(batch), gen.gen.options(lazy=True)(batch)
        expected = gen.gen(batch)
        held = next(source.held for source in first.remote_sources() if source.rank == 1)
        executor = gen.executor
        busy = gen.ranks([1]).sleep_later(3600)
        assert torch.equal(first.batch["small"], expected.batch["small"])  # a driver read of both ranks' rows

        def still_held() -> bool:
            probe = RowRequest(executor.row_address(1), 1, held.key, (), slice(0, 0))
            rows = Instructions(operation=Operation.ROWS)  # the core's beside read, as its ledger sends it
            read = Call("probe", (1,), [(RowAccess((probe,)),)], [{}], 30.0, instructions=rows, beside=True)
            handle = executor.submit(read)
            try:
                handle.result(30.0)
            except DispatchError as exc:
                assert "no longer held" in str(exc)
                return False
            return True

        assert still_held()
        del first
        assert torch.equal(second.batch["big"], expected.batch["big"])  # another read; it sends the frees too
        for _ in range(100):
            if not still_held():
                break
            time.sleep(0.05)
        else:
            pytest.fail(f"{held.key} still held by rank 1 after its free")
        assert not busy.done()


def test_a_shut_down_group_still_referenced_holds_no_connections() -> None:
    """The driver's row plane (made by a column read) goes at shutdown, with the store it holds."""
    if "torchrun" not in available_backends():
        pytest.skip("torchrun backend unavailable")

    def open_fds() -> set[str]:
        return set(os.listdir("/proc/self/fd"))

    with WorkerGroup(Colocated, 2, backend="torchrun"):  # one-time imports and threads
        pass
    gc.collect()
    before = open_fds()
    wg = WorkerGroup(Colocated, 2, backend="torchrun")
    gen = wg.spawn(["gen"])["gen"]
    column = gen.gen.options(lazy=True)(prompts(8, 16)).batch["small"]  # a driver read: the plane starts
    wg.shutdown()
    gc.collect()
    assert open_fds() <= before, "the shut-down group (still referenced) kept connections open"
    assert torch.equal(column, torch.arange(8).float() / 2)
    del gen, wg


@pytest.mark.timeout(60)
def test_a_driver_read_from_a_frozen_or_killed_producer_names_it() -> None:
    """The driver's own fetch sees a silent producer (lane pings) and a killed one (torn connection)."""
    if "torchrun" not in available_backends():
        pytest.skip("torchrun backend unavailable")
    for stop in (signal.SIGSTOP, signal.SIGKILL):
        with WorkerGroup(Colocated, 2, backend="torchrun", death_timeout=1.0) as wg:
            gen = wg.spawn(["gen"])["gen"]
            lazy = gen.gen.options(lazy=True)(prompts(8, 16))
            producer = gen.pid()[1]
            freeze(producer) if stop == signal.SIGSTOP else os.kill(producer, stop)
            try:
                with pytest.raises(WorkerDiedError) as died:
                    lazy.batch["big"]
                assert died.value.rank == 1
            finally:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(producer, signal.SIGKILL)
