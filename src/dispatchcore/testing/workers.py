"""Worker classes the conformance suite runs on every executor (importable, so ranks can load them)."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from .. import PADDING_ROWS_KEY, DataProto, Dispatch, Execute, Worker, make_nd_compute_dataproto_dispatch_fn, register
from ..executor import kept_results

MESH = "train"


def _tag_rows(data: DataProto, rank: int) -> DataProto:
    """The input rows plus a ``rank`` column saying who processed each."""
    tensors = dict(data.batch.items()) if data.batch is not None else {}
    tensors["rank"] = torch.full((len(data),), rank, dtype=torch.int64)
    return DataProto.from_dict(tensors, dict(data.non_tensor_batch), dict(data.meta_info))


class EchoWorker(Worker):
    """Reports what it received, per dispatch mode."""

    def __init__(self, tag: str = "echo") -> None:
        self.tag = tag
        self.rank_in_init = self.rank
        self.world_in_init = self.world_size
        self.stash: Any = None

    @register(Dispatch.ONE_TO_ALL)
    def info(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "world_size": self.world_size,
            "rank_in_init": self.rank_in_init,
            "world_in_init": self.world_in_init,
            "tag": self.tag,
            "pid": os.getpid(),
            "thread": threading.get_ident(),
        }

    @register(Dispatch.ONE_TO_ALL)
    def env(self, *names: str) -> dict[str, str | None]:
        return {name: os.environ.get(name) for name in names}

    @register(Dispatch.ONE_TO_ALL)
    def exposed(self) -> str:
        """What another user of the machine may read of this rank's process: command line and environment."""
        try:
            with open("/proc/self/cmdline", "rb") as f:  # noqa: PTH123 - procfs, not a project file
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # no procfs (macOS): the interpreter's view of it
            import sys

            cmdline = " ".join(sys.argv)
        return cmdline + "\n" + "\n".join(f"{k}={v}" for k, v in os.environ.items())

    @register(Dispatch.ALL_TO_ALL)
    def all_to_all(self, *args: Any, **kwargs: Any) -> tuple[int, tuple[Any, ...], dict[str, Any]]:
        return self.rank, args, kwargs

    @register(Dispatch.ONE_TO_ALL)
    def one_to_all(self, *args: Any, **kwargs: Any) -> tuple[int, tuple[Any, ...], dict[str, Any]]:
        return self.rank, args, kwargs

    @register(Dispatch.RANK_ZERO)
    def rank_zero(self, *args: Any) -> tuple[int, tuple[Any, ...]]:
        return self.rank, args

    @register(Dispatch.DP_COMPUTE)
    def dp_compute(self, *args: Any, **kwargs: Any) -> tuple[int, tuple[Any, ...], dict[str, Any]]:
        return self.rank, args, kwargs

    @register(Dispatch.DP_COMPUTE_PROTO)
    def echo(self, data: DataProto) -> DataProto:
        return _tag_rows(data, self.rank)

    @register(Dispatch.DP_COMPUTE_PROTO)
    def echo_pair(self, data: DataProto, other: DataProto, scale: int = 1) -> DataProto:
        out = _tag_rows(data, self.rank)
        out.batch["other"] = other.batch["x"] * scale
        return out

    @register(Dispatch.DP_COMPUTE_PROTO, blocking=False)
    def echo_later(self, data: DataProto) -> DataProto:
        return _tag_rows(data, self.rank)

    @register(Dispatch.DP_COMPUTE_PROTO_WITH_FUNC)
    def apply(self, fn: Callable[[DataProto], DataProto], data: DataProto) -> DataProto:
        return fn(data)

    @register(Dispatch.DP_COMPUTE_METRIC)
    def metric(self, data: DataProto) -> dict[str, int]:
        return {"rank": self.rank, "rows": len(data), "padding": int(data.meta_info.get(PADDING_ROWS_KEY, 0))}

    @register(Dispatch.DP_COMPUTE_PROTO, execute_mode=Execute.RANK_ZERO)
    def proto_on_rank_zero(self, data: DataProto) -> DataProto:
        return _tag_rows(data, self.rank)

    @register(Dispatch.ONE_TO_ALL, execute_mode=Execute.RANK_ZERO)
    def only_rank_zero(self) -> int:
        return self.rank

    @register(Dispatch.ONE_TO_ALL)
    async def coroutine(self, value: Any) -> tuple[int, Any]:
        await asyncio.sleep(0.001)
        return self.rank, value

    @register(Dispatch.ONE_TO_ALL, blocking=False)
    def sleep_then_rank(self, seconds: float) -> int:
        time.sleep(seconds)
        return self.rank

    @register(Dispatch.ONE_TO_ALL, blocking=False)
    def nap_until_cancelled(self) -> str:
        """Naps until its call is cancelled (``self.cancelled()``): for the cancel case."""
        while not self.cancelled():
            time.sleep(0.005)
        self.stash = "left when cancelled"
        return "left"

    @register(Dispatch.ONE_TO_ALL)
    def sleep(self, seconds: float) -> int:
        time.sleep(seconds)
        return self.rank

    @register(Dispatch.ONE_TO_ALL)
    def fail_on(self, rank: int) -> int:
        if self.rank == rank:
            raise ValueError(f"planted failure on rank {rank}")
        return self.rank

    @register(Dispatch.ONE_TO_ALL)
    def exit_on(self, rank: int) -> int:
        """Kill this rank's process (process backends only)."""
        if self.rank == rank:
            os._exit(3)
        time.sleep(0.5)
        return self.rank

    @register(Dispatch.ONE_TO_ALL)
    def mutate_inputs(self, tensor: torch.Tensor, data: DataProto, arr: np.ndarray, meta: dict[str, Any]) -> int:
        """Write into every input; the driver and other ranks must not notice."""
        before = int(tensor.sum())
        tensor.add_(1000)
        data.batch["x"].add_(1000)
        data.non_tensor_batch["s"][0] = "mutated"
        data.meta_info["touched"] = self.rank
        arr[0] = -1
        meta["touched"] = self.rank
        return before

    @register(Dispatch.DP_COMPUTE_PROTO)
    def mutate_chunk(self, data: DataProto) -> DataProto:
        received = data.batch["x"].clone()
        data.batch["x"].add_(1000)
        data.non_tensor_batch["s"][:] = "mutated"
        return DataProto.from_dict({"x": received})

    @register(Dispatch.ONE_TO_ALL)
    def kept_row_keys(self) -> int:
        """How many lazy results this rank's process keeps (the row store is per process)."""
        return kept_results()

    @register(Dispatch.ONE_TO_ALL)
    def keep(self, value: Any) -> None:
        self.stash = value

    @register(Dispatch.ONE_TO_ALL)
    def kept(self) -> Any:
        return self.stash

    @register(Dispatch.ONE_TO_ALL)
    def set_mesh(self, replicas: int) -> None:
        """``replicas`` consecutive ranks form one dp rank; the first collects."""
        self._register_dispatch_collect_info(MESH, dp_rank=self.rank // replicas, is_collect=self.rank % replicas == 0)

    @register(make_nd_compute_dataproto_dispatch_fn(MESH))
    def nd_echo(self, data: DataProto) -> DataProto:
        return _tag_rows(data, self.rank)

    @register(make_nd_compute_dataproto_dispatch_fn(MESH))
    def nd_checksum(self, *, data: DataProto) -> DataProto:
        out = _tag_rows(data, self.rank)
        out.meta_info.pop(PADDING_ROWS_KEY, None)
        return out

    @register(Dispatch.DIRECT_ROLLOUT_METHOD)
    def generate_direct(self) -> int:
        return self.rank

    def not_registered(self) -> int:
        return self.rank


class FailingInitWorker(Worker):
    """Raises in ``__init__`` on rank 1."""

    def __init__(self) -> None:
        if self.rank == 1:
            raise RuntimeError("planted __init__ failure")


class ActorRole(Worker):
    """One role of a colocated worker."""

    def __init__(self, lr: float = 0.1) -> None:
        self.lr = lr

    @register(Dispatch.ONE_TO_ALL)
    def whoami(self) -> tuple[str, int, int, int, float]:
        return "actor", self.rank, os.getpid(), threading.get_ident(), self.lr

    # The echo worker's methods, under a role's names: rows tagged with the rank that ran them.
    act = EchoWorker.echo
    set_mesh = EchoWorker.set_mesh
    nd_act = EchoWorker.nd_echo


class CriticRole(Worker):
    """Another role, sharing the ranks of :class:`ActorRole`."""

    @register(Dispatch.ONE_TO_ALL)
    def whoami(self) -> tuple[str, int, int, int, float]:
        return "critic", self.rank, os.getpid(), threading.get_ident(), 0.0

    @register(Dispatch.DP_COMPUTE_METRIC)
    def value(self, data: DataProto) -> float:
        return float(data.batch["x"].float().sum())
