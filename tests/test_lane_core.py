"""The core's lane on real processes: a LaneExecutor whose backend only spawns ranks.

Each case runs a small executor written here the way a backend would
(``launch_ranks``, ``stop_ranks``, an optional death signal and bulk path)
against the core's driver side (``LaneDriver``) and rank side (``LaneRank``).
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import pickle
import signal
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from _freeze import freeze
from dispatchcore import (
    DataProto,
    DispatchError,
    DispatchTimeoutError,
    UnpicklableError,
    WorkerDiedError,
    WorkerError,
)
from dispatchcore.executor import (
    Call,
    GroupSpec,
    HandedOver,
    Instructions,
    LaneAddress,
    LaneExecutor,
    LaneRank,
    lane_secret,
)
from dispatchcore.testing.workers import EchoWorker
from dispatchcore.wire import Serialized

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


class FileBulk:
    """A bulk path for the test: a value put on the driver is a file a rank reads (and removes) by its name."""

    min_bytes = 4096
    private = True

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self.puts: list[tuple[int, tuple[int, ...]]] = []
        self.gets: list[str] = []

    def put(self, value: Serialized, ranks: tuple[int, ...]) -> Any:
        name = f"value{len(self.puts)}" if ranks else f"result{os.environ['LANE_TEST_RANK']}-{len(self.puts)}"
        path = Path(self.folder) / name
        raws = [bytes(memoryview(b).cast("B")) for b in value.buffers]
        path.write_bytes(pickle.dumps((value.data, raws)))
        self.puts.append((value.nbytes, ranks))
        return str(path)

    def get(self, token: Any) -> Serialized:
        path = token
        data, raws = pickle.loads(Path(path).read_bytes())  # noqa: S301 - written by this test
        Path(f"{path}.read{os.environ.get('LANE_TEST_RANK', 'bydriver')}").touch()
        self.gets.append(Path(path).name)
        return Serialized(data, [bytearray(raw) for raw in raws])


def rank_main(address: str, rank: int, bulk_folder: str | None, secret: bytes) -> None:
    """A rank process: the core's rank side, nothing else."""
    os.environ["LANE_TEST_RANK"] = str(rank)
    bulk = FileBulk(bulk_folder) if bulk_folder else None
    LaneRank(rank, bulk=bulk, on_driver_gone=lambda: os._exit(0)).serve(address, secret=secret)
    os._exit(0)


def exit_at_once(address: str, rank: int, bulk_folder: str | None, secret: bytes) -> None:
    """A rank process that dies before it connects."""
    os._exit(3)


class SpawnLane(LaneExecutor):
    """The whole backend: spawn a process per rank, say when one exited, stop them."""

    name = "lane-test"
    #: What each rank process runs (a test may make ranks that never connect).
    target = staticmethod(rank_main)
    start_timeout = 120.0

    def __init__(self, spec: GroupSpec, *, bulk: FileBulk | None = None, death_signal: bool = True) -> None:
        super().__init__(spec, bulk=bulk)
        self.bulk_folder = bulk.folder if bulk is not None else None
        self.death_signal = death_signal
        #: Ranks the test declares dead through the death signal, whatever their process does.
        self.declared: dict[int, str] = {}
        self.processes: dict[int, Any] = {}
        try:
            self.open_ranks(range(spec.world_size), self.start_timeout)
        except BaseException:
            self.shutdown()
            raise

    def launch_ranks(self, ranks: Sequence[int], address: LaneAddress) -> None:
        ctx = multiprocessing.get_context("spawn")
        for rank in ranks:
            process = ctx.Process(
                target=self.target, args=(address.encode(), rank, self.bulk_folder, lane_secret()), daemon=True
            )
            process.start()
            self.processes[rank] = process

    def rank_dead(self, rank: int) -> str | None:
        if rank in self.declared:
            return self.declared[rank]
        code = self.processes[rank].exitcode if self.death_signal and rank in self.processes else None
        return None if code is None else f"its process exited with code {code}"

    def stop_ranks(self) -> None:
        for process in self.processes.values():
            if process.is_alive():
                os.kill(process.pid, signal.SIGCONT)
                process.kill()
            process.join(5)


def spec(death_timeout: float = 60.0) -> GroupSpec:
    return GroupSpec(EchoWorker, 2, init_kwargs={"tag": "lane"}, death_timeout=death_timeout, name="lanetest")


def call(method: str, *args: Any, call_id: int = 0, **kwargs: Any) -> Call:
    return Call(method, (0, 1), [args] * 2, [kwargs] * 2, instructions=Instructions(call_id=call_id))


@pytest.fixture(scope="module")
def lane() -> Iterator[SpawnLane]:
    executor = SpawnLane(spec())
    yield executor
    executor.shutdown()


def test_a_call_round_trip_on_one_reader_thread(lane: SpawnLane) -> None:
    x = torch.arange(100_000)  # far above the inline frame: its bytes travel out of band
    out = lane.submit(call("one_to_all", x, k="v")).result(30)
    assert [rank for rank, _, _ in out] == [0, 1]
    assert all(torch.equal(args[0], x) and kwargs == {"k": "v"} for _, args, kwargs in out)
    per_rank = Call("all_to_all", (0, 1), [(10,), (11,)], [{}, {}])
    assert lane.submit(per_rank).result(30) == [(0, (10,), {}), (1, (11,), {})]
    assert lane.submit(call("keep", None)).result(30) == [None, None]
    readers = [t for t in threading.enumerate() if t.name == "dispatchcore-lane-lanetest"]
    assert len(readers) == 1, "one selector thread reads every link of the group"


def test_a_large_dataproto_answer_lands_in_the_rows_the_concatenation_adopts(lane: SpawnLane) -> None:
    chunks = [
        DataProto.from_dict({"x": torch.full((64, 4096), float(r)), "y": torch.arange(64) + 64 * r}) for r in (0, 1)
    ]
    copied = Call("echo", (0, 1), [(c,) for c in chunks], [{}, {}], results_are_copied=True)
    handle = lane.submit(copied)
    out = handle.result(30)
    joined = DataProto.concat(out, row_buffers=handle.row_buffers)
    assert torch.equal(joined.batch["x"], torch.cat([c.batch["x"] for c in chunks]))
    assert torch.equal(joined.batch["y"], torch.arange(128))
    assert torch.equal(joined.batch["rank"], torch.arange(128) // 64)
    storage = out[0].batch["x"].untyped_storage().data_ptr()
    assert out[1].batch["x"].untyped_storage().data_ptr() == storage, "both ranks' rows in one output buffer"
    assert joined.batch["x"].untyped_storage().data_ptr() == storage, "the concatenation adopted them, no copy"
    # A call whose results are not concatenated gets each rank's own memory, as before.
    plain = lane.submit(Call("echo", (0, 1), [(c,) for c in chunks], [{}, {}])).result(30)
    assert plain[0].batch["x"].untyped_storage().data_ptr() != plain[1].batch["x"].untyped_storage().data_ptr()
    assert torch.equal(plain[1].batch["x"], chunks[1].batch["x"])


def test_a_raising_rank_gives_worker_error_and_the_ranks_go_on(lane: SpawnLane) -> None:
    with pytest.raises(WorkerError) as info:
        lane.submit(call("fail_on", 1)).result(30)
    assert info.value.rank == 1 and info.value.method == "fail_on"
    assert "planted failure on rank 1" in info.value.remote_traceback
    assert lane.submit(call("fail_on", 5)).result(30) == [0, 1]


def test_cancel_and_stacks_beside_a_running_method(lane: SpawnLane) -> None:
    napping = call("nap_until_cancelled", call_id=4242)
    handle = lane.submit(napping)
    stacks = lane.rank_stacks((0, 1), False, 10)
    while not all("nap_until_cancelled" in stacks.get(rank, "") for rank in (0, 1)):
        time.sleep(0.01)  # cancel once both ranks run it (one that had not begun would skip it)
        stacks = lane.rank_stacks((0, 1), False, 10)
    assert lane.cancel_call(napping, (0, 1))
    assert handle.result(30) == ["left", "left"]
    assert lane.submit(call("kept")).result(30) == ["left when cancelled"] * 2


def test_an_unpicklable_argument_is_refused_before_anything_is_sent(lane: SpawnLane) -> None:
    lane.submit(call("keep", "before")).result(30)
    lock = threading.Lock()
    refused = Call("keep", (0, 1), [("sent to rank 0",), (lock,)], [{}, {}])
    with pytest.raises(UnpicklableError, match="cannot be pickled"):
        lane.submit(refused)
    assert lane.submit(call("kept")).result(30) == ["before", "before"], "rank 0 got nothing either"


def test_a_rank_killed_mid_call_is_seen_by_its_link_ending() -> None:
    executor = SpawnLane(spec(), death_signal=False)
    try:
        handle = executor.submit(call("sleep", 60))
        os.kill(executor.processes[1].pid, signal.SIGKILL)
        with pytest.raises(WorkerDiedError) as info:
            handle.result(30)
        assert info.value.rank == 1 and "lane link" in str(info.value)
    finally:
        executor.shutdown()


def test_a_rank_killed_mid_call_is_named_by_the_death_signal() -> None:
    executor = SpawnLane(spec())
    try:
        handle = executor.submit(call("sleep", 60))
        os.kill(executor.processes[1].pid, signal.SIGKILL)
        with pytest.raises(WorkerDiedError) as info:
            handle.result(30)
        assert info.value.rank == 1 and "exited with code -9" in str(info.value)
    finally:
        executor.shutdown()


def test_the_death_signal_alone_ends_a_rank_whose_links_stay_open() -> None:
    executor = SpawnLane(spec(death_timeout=600))  # pings could not tell within the test's bound
    try:
        handle = executor.submit(call("sleep", 60))
        freeze(executor.processes[1].pid)  # alive, links open, silent
        executor.declared[1] = "its actor was declared dead"
        with pytest.raises(WorkerDiedError) as info:
            handle.result(60)
        assert info.value.rank == 1 and "declared dead" in str(info.value)
    finally:
        executor.shutdown()


def test_a_silent_rank_is_given_up_after_death_timeout() -> None:
    executor = SpawnLane(spec(death_timeout=1.0), death_signal=False)
    try:
        handle = executor.submit(call("sleep", 60))
        freeze(executor.processes[1].pid)
        with pytest.raises(WorkerDiedError) as info:
            handle.result(60)
        assert info.value.rank == 1 and "liveness ping" in str(info.value)
    finally:
        executor.shutdown()


class NeverJoins(SpawnLane):
    target = staticmethod(exit_at_once)
    start_timeout = 600.0  # far past the case's bound: only the death signal can end the wait in time


def test_a_rank_that_dies_before_joining_fails_the_start_at_once_by_the_death_signal() -> None:
    with pytest.raises(DispatchError, match=r"never connected.*exited with code 3"):
        NeverJoins(spec())


def never_connect(address: str, rank: int, bulk_folder: str | None, secret: bytes) -> None:
    """A rank process that is alive but never connects (stuck before its lane, as a hung start-up is)."""
    time.sleep(120)


class NeverConnects(SpawnLane):
    target = staticmethod(never_connect)
    start_timeout = 1.0


def test_ranks_that_never_connect_are_named_by_rank_in_the_timeout() -> None:
    with pytest.raises(DispatchTimeoutError) as info:
        NeverConnects(spec())
    assert info.value.ranks == (0, 1) and info.value.method is None, "the backend learns which never connected"
    assert "rank processes [0, 1] did not connect to the driver within 1 s" in str(info.value)


class ReplacingLane(SpawnLane):
    """Replaces a rank by a new process; its ``rank_gone`` is slow, as a loaded machine makes any thread."""

    def __init__(self, spec: GroupSpec) -> None:
        #: The pid each ``rank_gone`` took for the rank's process (what a backend marks gone).
        self.gone: list[int] = []
        super().__init__(spec)

    def rank_gone(self, rank: int, reason: str) -> None:
        time.sleep(0.5)  # meanwhile the caller its death woke replaces the rank
        self.gone.append(self.processes[rank].pid)

    def replace(self, rank: int) -> None:
        with self.lane.membership:  # as a backend does: retire the rank, then give it another process
            self.lane.retire([rank], f"rank {rank} was replaced")
            self.processes.pop(rank).join(5)
        self.open_ranks([rank], self.start_timeout)


def test_a_late_death_report_never_names_the_process_that_replaced_the_rank() -> None:
    """A torchrun spare was once marked gone this way: its join order was dropped, and the replace hung."""
    executor = ReplacingLane(spec())
    try:
        old = executor.processes[1].pid
        handle = executor.submit(call("sleep", 60))
        os.kill(old, signal.SIGKILL)
        with pytest.raises(WorkerDiedError):
            handle.result(30)
        executor.replace(1)  # at once, as a user's recovery does
        new = executor.processes[1].pid
        assert executor.submit(Call("kept", (1,), [()], [{}])).result(30) is not None  # the new process serves
        time.sleep(1.0)  # a report still on its way would land by now
        assert new not in executor.gone and set(executor.gone) <= {old}, (old, new, executor.gone)
    finally:
        executor.shutdown()


def test_a_bulk_path_carries_large_values_once_for_every_rank_reading_them() -> None:
    with tempfile.TemporaryDirectory() as folder:
        bulk = FileBulk(folder)
        executor = SpawnLane(spec(), bulk=bulk)
        try:
            big = torch.arange(10_000)
            out = executor.submit(call("one_to_all", big, "small")).result(30)
            assert all(torch.equal(args[0], big) and args[1] == "small" for _, args, _ in out)
            assert [ranks for _, ranks in bulk.puts] == [(0, 1)], "the big value alone, put once for both ranks"
            assert sorted(p.name for p in Path(folder).glob("value*.read*")) == ["value0.read0", "value0.read1"]
            touched = executor.submit(call("mutate_inputs", big, *_inputs())).result(30)
            assert touched == [int(big.sum())] * 2 and torch.equal(big, torch.arange(10_000))
            executor.submit(Call("keep", (0, 1), [(big,), (big + 1,)], [{}, {}])).result(30)
            before = len(bulk.gets)
            kept = executor.submit(call("kept")).result(30)  # results that large come back by the path too
            assert torch.equal(kept[0], big) and torch.equal(kept[1], big + 1)
            assert sorted(name.split("-")[0] for name in bulk.gets[before:]) == ["result0", "result1"]
        finally:
            executor.shutdown()


def _inputs() -> tuple[Any, ...]:
    data = DataProto.from_dict({"x": torch.arange(4)}, non_tensors={"s": np.array(list("abcd"), dtype=object)})
    return data, np.zeros(3), {"k": 1}


@dataclasses.dataclass
class Handle:
    """A value only the test's bulk path may move, as it is (as Ray's object references are)."""

    name: str


class ClaimingBulk(FileBulk):
    """``FileBulk`` that also claims every :class:`Handle` (never pickled by the envelope) and counts flushes."""

    def __init__(self, folder: str) -> None:
        super().__init__(folder)
        self.claimed: list[tuple[Any, tuple[int, ...]]] = []
        self.flushes = 0

    def claims(self, value: Any) -> bool:
        return isinstance(value, Handle)

    def put(self, value: Any, ranks: tuple[int, ...]) -> Any:
        if isinstance(value, Serialized):
            return super().put(value, ranks)
        self.claimed.append((value, ranks))
        path = Path(self.folder) / f"handle{len(self.claimed)}-{os.environ.get('LANE_TEST_RANK', 'driver')}"
        path.write_bytes(pickle.dumps(value))
        return ("handle", str(path))

    def get(self, token: Any) -> Serialized | HandedOver:
        if isinstance(token, tuple) and token[0] == "handle":
            return HandedOver(pickle.loads(Path(token[1]).read_bytes()))  # noqa: S301 - written by this test
        return super().get(token)

    def flush(self) -> None:
        self.flushes += 1


def claiming_rank_main(address: str, rank: int, bulk_folder: str | None, secret: bytes) -> None:
    os.environ["LANE_TEST_RANK"] = str(rank)
    assert bulk_folder is not None  # noqa: S101
    LaneRank(rank, bulk=ClaimingBulk(bulk_folder), on_driver_gone=lambda: os._exit(0)).serve(address, secret=secret)
    os._exit(0)


class ClaimingLane(SpawnLane):
    target = staticmethod(claiming_rank_main)


def test_a_bulk_path_may_claim_values_it_moves_as_they_are_both_ways() -> None:
    with tempfile.TemporaryDirectory() as folder:
        bulk = ClaimingBulk(folder)
        executor = ClaimingLane(spec(), bulk=bulk)
        try:
            out = executor.submit(call("one_to_all", Handle("in"), "small")).result(30)
            # (a class of this test module travels by value: each trip back makes a new class, so names are compared)
            assert [(args[0].name, args[1]) for _, args, _ in out] == [("in", "small")] * 2
            assert bulk.claimed == [(Handle("in"), (0, 1))], "the value itself, put once for both ranks"
            assert bulk.flushes == 1, "flushed once the call's values were put, before it was sent"
            executor.submit(Call("keep", (0, 1), [(Handle("r0"),), (Handle("r1"),)], [{}, {}])).result(30)
            handle = executor.submit(call("kept"))
            assert [h.name for h in handle.result(30)] == ["r0", "r1"]  # claimed by the ranks, handed over as they are
            assert sorted(token[0] for token in handle.bulk_results.values()) == ["handle", "handle"]
        finally:
            executor.shutdown()
