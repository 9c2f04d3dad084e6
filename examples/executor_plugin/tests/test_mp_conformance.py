"""The full conformance suite on the example executor, installed as its own package,
plus what is specific to it (processes, rank environment, large buffers)."""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch

from dispatchcore import DataProto, WorkerGroup
from dispatchcore.testing.conformance import ExecutorConformance
from dispatchcore.testing.workers import EchoWorker

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

RANK_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


class TestMultiprocessConformance(ExecutorConformance):
    backend = "multiprocess"
    ranks_are_processes = True

    # -- specific to this executor, on the suite's shared group ----------------
    def test_one_process_per_rank_with_torchrun_env(self, group: WorkerGroup[Any]) -> None:
        pids = {info["pid"] for info in group.info()}
        assert len(pids) == self.world_size and os.getpid() not in pids
        envs = group.env(*RANK_VARS)
        assert [e["RANK"] for e in envs] == [str(r) for r in range(self.world_size)]
        assert [e["LOCAL_RANK"] for e in envs] == [str(r) for r in range(self.world_size)]
        assert {e["WORLD_SIZE"] for e in envs} == {str(self.world_size)}
        assert {e["MASTER_ADDR"] for e in envs} == {"127.0.0.1"}
        (port,) = {e["MASTER_PORT"] for e in envs}
        assert os.environ.get("MASTER_PORT") != port, "the driver's own environment must stay untouched"

    def test_large_payloads_travel_out_of_band_and_isolated(self, group: WorkerGroup[Any]) -> None:
        rows = 4 * self.world_size * 10_000  # 1.3 MB of int64 + float rows: far above the inline limit
        x = torch.arange(rows)
        data = DataProto.from_dict({"x": x, "y": x.to(torch.float64)})
        out = group.echo(data)
        assert torch.equal(out.batch["x"], x) and torch.equal(out.batch["y"], x.to(torch.float64))
        assert out.batch["rank"].tolist()[:: rows // self.world_size] == list(range(self.world_size))
        touched = group.mutate_chunk(DataProto.from_dict({"x": x}, non_tensors={"s": x.numpy().astype(object)}))
        assert torch.equal(touched.batch["x"], x) and torch.equal(data.batch["x"], x)
        big = torch.zeros(100_000)
        group.keep(big)  # broadcast: one pickle, one private copy per rank
        big.add_(1)
        assert all(torch.equal(kept, torch.zeros(100_000)) for kept in group.kept())

    def test_unknown_option_lists_the_known_ones(self) -> None:
        with pytest.raises(TypeError, match="start_timeout"):
            self.make_group(EchoWorker, 2, not_an_option=1)
