"""An FSDP2 trainer that declares its sharded state and recovers through the library's hook.

Ranks in other processes cannot import ``tests/``: the module travels by value.
"""

from __future__ import annotations

import hashlib
import os
import sys
from typing import Any

import cloudpickle
import torch

from dispatchcore import Dispatch, Worker, collective, register


class RaiseInBackward(torch.autograd.Function):
    """Identity forward; its backward raises where told (a fault inside backward, mid-FSDP2 step)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, fail: bool) -> torch.Tensor:
        ctx.fail = fail
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        if ctx.fail:
            raise RuntimeError("a fault inside backward")
        return grad, None


class ShardedTrainer(Worker):
    """Two FSDP2 units and an Adam over them; a DCP checkpoint; the recovery hook rebuilds and reloads."""

    sharded_modules = ("model",)
    sharded_optimizers = ("optimizer",)

    def __init__(self, checkpoint: str, mesh_shape: tuple[int, ...] | None = None) -> None:
        if mesh_shape is None:
            self.mesh = collective.init_process_group()
        else:  # the user's own mesh on the library's group
            from torch.distributed.device_mesh import init_device_mesh

            collective.init_process_group()
            self.mesh = init_device_mesh("cpu", mesh_shape, mesh_dim_names=("replicate", "shard"))
        self.checkpoint = checkpoint
        self.rebuilds = 0
        self.forget_optimizer = False
        self._build()

    def _build(self) -> None:
        from torch.distributed.fsdp import fully_shard

        torch.manual_seed(0)
        self.model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))
        fully_shard(self.model[0], mesh=self.mesh)
        fully_shard(self.model, mesh=self.mesh)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=0.01)

    def _state(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model, optimizer = get_state_dict(self.model, self.optimizer)
        return {"model": model, "optimizer": optimizer}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save(self) -> None:
        import torch.distributed.checkpoint as dcp

        dcp.save(self._state(), checkpoint_id=self.checkpoint)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def resume(self) -> None:
        """What a clean run resumed from the checkpoint does: build, then load."""
        self.recover_sharded_state()

    def recover_sharded_state(self) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import set_state_dict

        self.rebuilds += 1
        stale = self.optimizer
        self._build()
        if self.forget_optimizer:
            self.optimizer = stale
            return
        state = self._state()
        dcp.load(state, checkpoint_id=self.checkpoint)
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def step(self, seed: int, fail_in_backward: int = -1, nan_guard: int = -1) -> float:
        self.optimizer.zero_grad()
        torch.manual_seed(seed * 100 + self.rank)
        batch = torch.randn(4, 8)
        out = RaiseInBackward.apply(self.model(batch), self.rank == fail_in_backward)
        loss = out.pow(2).mean()
        loss.backward()
        if self.rank == nan_guard:
            raise FloatingPointError("the NaN guard tripped")
        self.optimizer.step()
        return float(loss.detach())

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def reference_forward(self) -> float:
        """A no-grad forward (a reference model's): FSDP2 leaves the root unsharded after it."""
        with torch.no_grad():
            return float(self.model(torch.ones(2, 8)).sum())

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def fingerprint(self) -> tuple[str, int]:
        """A hash of the full weights (gathered) and how many times the hook rebuilt this rank."""
        digest = hashlib.sha256()
        for name, value in sorted(self.model.state_dict().items()):
            digest.update(name.encode())
            digest.update(value.full_tensor().detach().numpy().tobytes())
        return digest.hexdigest()[:16], self.rebuilds

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def check(self) -> Any:
        """What the library's check reads on this rank (FSDP2's private state, pinned to torch 2.13)."""
        from dispatchcore._worker import sharded_report

        return sharded_report(self)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def pid(self) -> int:
        return os.getpid()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def set_forget_optimizer(self, forget: bool) -> None:
        self.forget_optimizer = forget


class WithoutHook(ShardedTrainer):
    """Declares its sharded state but defines no hook (the library's default)."""

    recover_sharded_state = Worker.recover_sharded_state


cloudpickle.register_pickle_by_value(sys.modules[__name__])
