"""Worker classes for the ray backend's own tests.

They live beside the tests, not in an installed package: the actors cannot
import this module by name, so their code travels by value
(``dispatchcore.wire``), as any user's test-module workers do.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import numpy as np
import torch

from dispatchcore import DataProto, Dispatch, Worker, register


class EnvWorker(Worker):
    """Reports what it saw while being built and runs a gloo all_reduce."""

    def __init__(self) -> None:
        keys = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "EXTRA")
        self.seen = {k: os.environ.get(k) for k in keys}
        self.seen_rank = self.rank

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def environment(self) -> dict[str, Any]:
        return {**self.seen, "self_rank": self.seen_rank, "pid": os.getpid()}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def all_reduce(self, value: float) -> float:
        import torch.distributed as dist

        if not dist.is_initialized():
            dist.init_process_group("gloo")
        t = torch.tensor([value * (self.rank + 1)])
        dist.all_reduce(t)
        result = float(t.item())
        dist.destroy_process_group()
        return result


class DataWorker(Worker):
    """Echo, mutate-in-place and failure cases."""

    def __init__(self, offset: int = 0) -> None:
        self.offset = offset

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def echo(self, data: DataProto) -> DataProto:
        return data

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def add_offset(self, data: DataProto) -> DataProto:
        data.batch["x"] = data.batch["x"] + self.offset
        return data

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def mutate(self, data: DataProto, extra: torch.Tensor) -> DataProto:
        """Rank 0 writes into its chunk and the broadcast tensor; every rank reports what it sees."""
        if self.rank == 0:
            data.batch["x"].add_(1000)
            extra.add_(1000)
        else:
            time.sleep(0.2)
        return DataProto.from_dict({"x": data.batch["x"].clone(), "extra": extra.clone().expand(len(data), -1)})

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def shared_write(self, t: torch.Tensor) -> int:
        """Rank 0 writes ``t[0] = 7``; later ranks report the ``t[0]`` they see."""
        if self.rank == 0:
            t[0] = 7
        else:
            time.sleep(0.5)
        return int(t[0])

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def fail(self, rank: int) -> int:
        if self.rank == rank:
            raise ValueError(f"planted failure on rank {rank}")
        return self.rank

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def die(self, rank: int, how: str = "exit") -> int:
        if self.rank == rank:
            if how == "exit":
                os._exit(3)
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(0.5)
        return self.rank

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def sleep(self, seconds: float) -> int:
        time.sleep(seconds)
        return self.rank

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def pid(self) -> int:
        return os.getpid()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def placement(self) -> dict[str, Any]:
        """What Ray gave this actor: resources and placement group bundle."""
        import ray

        ctx = ray.get_runtime_context()
        pg = ctx.get_placement_group_id()
        return {"resources": ctx.get_assigned_resources(), "pg": pg, "node": ctx.get_node_id()}


class Counter(Worker):
    """Stateful role for colocation and detached tests."""

    def __init__(self, start: int = 0) -> None:
        self.value = start

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def add(self, n: int) -> int:
        self.value += n
        return self.value

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def pid(self) -> int:
        return os.getpid()


class Doubler(Worker):
    """Second role for colocation tests."""

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def double(self, data: DataProto) -> DataProto:
        return DataProto.from_dict({"x": data.batch["x"] * 2})

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def pid(self) -> int:
        return os.getpid()


class BadInit(Worker):
    def __init__(self) -> None:
        if self.rank == 1:
            raise RuntimeError("cannot build rank 1")


class RowsWorker(Worker):
    """Lazy results' tests: makes rows on the ranks, consumes them, reports what it keeps."""

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def gen(self, prompts: DataProto) -> DataProto:
        """``width`` (meta_info) columns of tokens and log-probs per prompt, derived from ``x``."""
        width = int(prompts.meta_info.get("width", 4))
        x = prompts.batch["x"].to(torch.int64)
        tokens = x.unsqueeze(1) * 1000 + torch.arange(width, dtype=torch.int64)
        return DataProto.from_dict(
            tensors={"tokens": tokens, "logp": tokens.to(torch.float32) / 7, "reward": x.to(torch.float32) / 2},
            non_tensors={"uid": np.array([f"u{int(v)}" for v in x], dtype=object)},
            meta_info=dict(prompts.meta_info),
        )

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def echo(self, data: DataProto) -> DataProto:
        """The chunk as received, plus which rank had each row."""
        return DataProto.from_dict(
            tensors={**dict(data.batch.items()), "rank": torch.full((len(data),), self.rank, dtype=torch.int64)},
            non_tensors=dict(data.non_tensor_batch),
        )

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def checksum(self, data: DataProto) -> DataProto:
        """One float per row: small results, so only the argument's rows could be big."""
        total = data.batch["tokens"].sum(dim=1).to(torch.float64) + data.batch["logp"].sum(dim=1).to(torch.float64)
        return DataProto.from_dict({"sum": total})

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def holds(self, keys: list[str]) -> list[bool]:
        """Which of ``keys`` this rank's process still keeps."""
        from dispatchcore.executor import holds_kept_rows

        return [holds_kept_rows(key) for key in keys]

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def sleep_later(self, seconds: float) -> int:
        time.sleep(seconds)
        return self.rank

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def pid(self) -> int:
        return os.getpid()
