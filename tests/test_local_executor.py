"""Sizes one case by an internal part (the local executor's driver-copy threshold): imports executors_local._executor.

What only the in-process executor promises: threads, zero-copy opt-out, exit without hanging.
``DRIVER_COPY_BYTES`` puts the large case of the private-copies test on the ranks' side of the threshold.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
from typing import ClassVar

import pytest
import torch

from dispatchcore import DataProto, Dispatch, UnpicklableError, Worker, WorkerGroup, register
from executors_local._executor import DRIVER_COPY_BYTES


class Holder(Worker):
    @register(Dispatch.ONE_TO_ALL)
    def pointer(self, t: torch.Tensor) -> int:
        return t.data_ptr()

    @register(Dispatch.DP_COMPUTE_PROTO)
    def chunk_pointer(self, data: DataProto) -> DataProto:
        return DataProto.from_dict({"p": torch.full((len(data),), data.batch["x"].data_ptr())})

    @register(Dispatch.ONE_TO_ALL)
    def thread(self) -> int:
        return threading.get_ident()


def test_isolate_false_hands_shared_memory() -> None:
    t = torch.arange(8)
    with WorkerGroup(Holder, 2, isolate=False) as wg:
        assert wg.pointer(t) == [t.data_ptr()] * 2
        out = wg.chunk_pointer(DataProto.from_dict({"x": t}))
        assert out.batch["p"].tolist() == [t.data_ptr()] * 4 + [t.data_ptr() + 4 * 8] * 4
    with WorkerGroup(Holder, 2) as wg:
        assert t.data_ptr() not in wg.pointer(t)


def test_a_rank_always_runs_on_the_same_thread() -> None:
    with WorkerGroup(Holder, 3) as wg:
        first = wg.thread()
        assert len(set(first)) == 3 and threading.get_ident() not in first
        for _ in range(5):
            assert wg.thread() == first


def test_interpreter_exits_with_a_stuck_worker() -> None:
    script = textwrap.dedent(
        """
        import time
        from dispatchcore import Dispatch, Worker, WorkerGroup, register

        class Stuck(Worker):
            @register(Dispatch.ONE_TO_ALL, blocking=False)
            def forever(self):
                time.sleep(3600)

        wg = WorkerGroup(Stuck, 2)
        wg.forever()
        print("leaving")
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "leaving" in done.stdout


class Mutator(Worker):
    @register(Dispatch.DP_COMPUTE_PROTO)
    def add_one(self, data: DataProto) -> DataProto:
        seen = data.batch["x"].clone()
        data.batch["x"].add_(1)  # a write the driver and the other ranks must not see
        return DataProto.from_dict({"x": seen, "p": torch.full((len(data),), data.batch["x"].data_ptr())})


@pytest.mark.parametrize("rows", [8, 2 * DRIVER_COPY_BYTES // 8], ids=["copied on the driver", "copied on the ranks"])
def test_dp_chunks_are_private_copies_at_every_size(rows: int) -> None:
    x = torch.arange(rows)
    with WorkerGroup(Mutator, 2) as wg:
        out = wg.add_one(DataProto.from_dict({"x": x}))
    assert torch.equal(out.batch["x"], torch.arange(rows)) and torch.equal(x, torch.arange(rows))
    pointers = set(out.batch["p"].tolist())
    assert len(pointers) == 2 and x.data_ptr() not in pointers


@pytest.mark.parametrize("rows", [4, 2 * DRIVER_COPY_BYTES // 8], ids=["copied on the driver", "copied on the ranks"])
def test_argument_that_cannot_be_copied_is_refused_before_any_rank_runs(rows: int) -> None:
    """Refused at submit, as on process backends, whether the driver or the ranks would have copied it."""
    unpicklable = DataProto.from_dict({"x": torch.arange(rows)}, meta_info={"lock": threading.Lock()})
    with WorkerGroup(Mutator, 2) as wg:
        with pytest.raises(UnpicklableError, match=r"argument 'data' of rank 0 → data\.meta_info\['lock'\]"):
            wg.add_one(unpicklable)
        assert wg.add_one(DataProto.from_dict({"x": torch.arange(4)})).batch["x"].tolist() == [0, 1, 2, 3]


class _KeptRows(Worker):
    produced: ClassVar[dict[int, int]] = {}

    @register(Dispatch.DP_COMPUTE_PROTO)
    def make(self, data: DataProto) -> DataProto:
        out = DataProto.from_dict({"x": data.batch["x"] * 2})
        _KeptRows.produced[self.rank] = out.batch["x"].untyped_storage().data_ptr()
        return out

    @register(Dispatch.DP_COMPUTE_PROTO)
    def shares(self, data: DataProto) -> DataProto:
        ptr = data.batch["x"].untyped_storage().data_ptr()
        shared = ptr == _KeptRows.produced[self.rank]
        return DataProto.from_dict({"shared": torch.full((len(data),), shared)})


@pytest.mark.parametrize("isolate", [True, False])
def test_lazy_rows_read_in_place_only_without_isolation(isolate: bool) -> None:
    with WorkerGroup(_KeptRows, 2, backend="local", isolate=isolate) as wg:
        lazy = wg.make.options(lazy=True)(DataProto.from_dict({"x": torch.arange(8)}))
        shared = wg.shares(lazy).batch["shared"]
        assert shared.tolist() == [not isolate] * 8
        assert lazy.batch["x"].tolist() == [2 * i for i in range(8)]
