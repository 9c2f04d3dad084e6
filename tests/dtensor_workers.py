"""Worker classes for DTensor weight transfers: a trainer offering FSDP2-placed DTensors, a rollout to check.

A module of the tests (not importable by the ranks: its code travels by
value, as any test module's does).  The trainer makes torch's default
process group over its own ranks (gloo, from the rank environment every
process backend gives) and builds its DTensors with torch's own split
(``fully_shard``, ``distribute_tensor``), so the offsets the transfer reads
are checked against torch's.  Needs a process backend: threads (``local``)
share one process and cannot hold a process group each.
"""

from __future__ import annotations

from typing import Any

import torch

from dispatchcore import Dispatch, Worker, register

__all__ = ["OFFER_KINDS", "FsdpTrainer", "Rollout", "full_weights", "model"]

#: What :meth:`FsdpTrainer.configure` can offer (``hsdp_2x2``: four ranks); the last two cannot be sent as they are.
OFFER_KINDS = ("fsdp", "state_dict", "replicate", "hsdp_2x1", "hsdp_1x2", "hsdp_2x2", "shard1", "partial")


def model() -> torch.nn.Module:
    """The same model on every rank and on the driver: over 2 ranks 5 rows split 3 + 2 (uneven), 4 rows
    2 + 2 (even), 1 row 1 + 0 (one rank holds none)."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.Tanh(), torch.nn.Linear(5, 4), torch.nn.Linear(4, 1))


def full_weights() -> dict[str, torch.Tensor]:
    """:func:`model`'s parameters, whole: what every destination must end up with."""
    return {name: p.detach().clone() for name, p in model().named_parameters()}


class FsdpTrainer(Worker):
    """A trainer holding DTensors on a gloo default group of its own ranks (as FSDP2 would)."""

    def __init__(self) -> None:
        super().__init__()
        import torch.distributed as dist

        if not dist.is_initialized():
            dist.init_process_group("gloo")
        self.kind = "fsdp"
        self._offer: dict[str, Any] = {}
        self.configure("fsdp")

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def configure(self, kind: str) -> None:
        """Build the offer of ``kind`` (collective where a mesh is made: every rank runs it)."""
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        from torch.distributed.tensor import DTensor, Partial, Replicate, distribute_tensor
        from torch.distributed.tensor import Shard as Placed

        self.kind = kind
        n = self.world_size
        full = full_weights()
        if kind in ("fsdp", "state_dict"):
            net = model()
            fully_shard(net, mesh=init_device_mesh("cpu", (n,)))
            self._offer = dict(net.named_parameters()) if kind == "fsdp" else net.state_dict()
        elif kind == "replicate":
            mesh = init_device_mesh("cpu", (n,))
            self._offer = {k: DTensor.from_local(t, mesh, [Replicate()], run_check=False) for k, t in full.items()}
        elif kind in ("hsdp_2x1", "hsdp_1x2", "hsdp_2x2"):
            shape = {"hsdp_2x1": (n, 1), "hsdp_1x2": (1, n), "hsdp_2x2": (2, n // 2)}[kind]
            mesh = init_device_mesh("cpu", shape, mesh_dim_names=("replicate", "shard"))
            placed = [Replicate(), Placed(0)]
            self._offer = {k: distribute_tensor(t, mesh, placed, src_data_rank=None) for k, t in full.items()}
        elif kind == "shard1":
            mesh = init_device_mesh("cpu", (n,))
            self._offer = {
                k: distribute_tensor(t, mesh, [Placed(t.dim() - 1)], src_data_rank=None) for k, t in full.items()
            }
        elif kind == "partial":
            mesh = init_device_mesh("cpu", (n,))
            self._offer = {"0.weight": DTensor.from_local(full["0.weight"], mesh, [Partial()], run_check=False)}

    def weights(self) -> dict[str, Any]:
        return self._offer

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def alive(self) -> int:
        return self.rank


class Rollout(Worker):
    """Keeps what arrives (``spoil`` makes ``load_weights`` keep other bytes for one name, to be caught)."""

    def __init__(self) -> None:
        super().__init__()
        self.got: dict[str, torch.Tensor] = {}
        self.spoiled: str | None = None

    def load_weights(self, weights: list[tuple[str, torch.Tensor]]) -> None:
        for name, t in weights:
            self.got[name] = t + 1 if name == self.spoiled else t.clone()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def spoil(self, name: str | None) -> None:
        self.spoiled = name

    def weights(self) -> dict[str, torch.Tensor]:  # what verify() reads back
        return self.got

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def state(self) -> tuple[dict[str, torch.Tensor], Any]:
        return self.got, getattr(self, "weights_version", None)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def corrupt(self, name: str) -> None:
        self.got[name] = self.got[name] + 1
