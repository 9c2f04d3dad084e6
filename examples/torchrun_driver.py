"""An RL-style driver that runs unchanged on threads or under torchrun.

    torchrun --standalone --nproc-per-node=2 examples/torchrun_driver.py
    python examples/torchrun_driver.py --backend local

Both print the same lines.  Under torchrun, rank 0 runs this script as the
driver and hosts worker 0; rank 1 runs it up to the first ``WorkerGroup(...)``
and serves calls there until the driver ends.  The worker classes are
defined in this script, so they travel to the other rank by value.
"""

from __future__ import annotations

import argparse
import os

import torch

from dispatchcore import DataProto, Dispatch, Worker, WorkerGroup, create_colocated_worker_cls, register


class Actor(Worker):
    def __init__(self, lr: float) -> None:
        self.lr = lr
        self.steps = 0

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def describe(self) -> str:
        return f"actor rank {self.rank}/{self.world_size} lr={self.lr}"

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def update_actor(self, data: DataProto) -> DataProto:
        self.steps += 1
        logp = data.batch["obs"].float().mean(dim=1) * self.lr
        return DataProto.from_dict({"logp": logp, "rank": torch.full((len(data),), self.rank)})

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO_WITH_FUNC)
    def apply(self, fn, data: DataProto) -> DataProto:  # noqa: ANN001 - any function
        return fn(data)


class Critic(Worker):
    @register(dispatch_mode=Dispatch.DP_COMPUTE_METRIC)
    def values(self, data: DataProto) -> float:
        return float(data.batch["obs"].sum())


class Reference(Worker):
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def whoami(self) -> str:
        return f"reference rank {self.rank}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--backend", default="torchrun" if "TORCHELASTIC_RUN_ID" in os.environ else "local")
    args = parser.parse_args(argv)
    torchrun = args.backend == "torchrun"

    actor = WorkerGroup(Actor, 2, backend=args.backend, init_kwargs={"lr": 0.5})
    # The critic lives on process rank 1 only (a subset of the world under torchrun).
    critic = WorkerGroup(Critic, 1, backend=args.backend, **({"ranks": [1]} if torchrun else {}))
    colocated = WorkerGroup(
        create_colocated_worker_cls({"ref": Reference, "actor": Actor}),
        2,
        backend=args.backend,
        init_kwargs={"actor": {"lr": 0.1}},
    )

    batch = DataProto.from_dict({"obs": torch.arange(24, dtype=torch.float32).reshape(6, 4)})
    print("describe:", actor.describe())
    out = actor.update_actor(batch)
    print("logp:", [round(v, 3) for v in out.batch["logp"].tolist()])
    print("rank of each row:", out.batch["rank"].tolist())
    shift = 100.0
    shifted = actor.apply(lambda d: DataProto.from_dict({"obs": d.batch["obs"] + shift}), batch)
    print("shifted first column:", shifted.batch["obs"][:, 0].tolist())
    print("critic values:", critic.values(batch))
    roles = colocated.spawn({"ref", "actor"})
    print("colocated:", roles["ref"].whoami(), roles["actor"].describe())
    for group in (actor, critic, colocated):
        group.shutdown()
    print("done")


if __name__ == "__main__":
    main()
