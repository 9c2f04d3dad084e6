"""Quickstart: one driver, N workers, a batch split by a decorator.

Run: python examples/quickstart.py [--backend local|ray|torchrun] [--world-size N]
"""

from __future__ import annotations

import argparse

import torch

from dispatchcore import DataProto, Dispatch, Worker, WorkerGroup, register


class Scorer(Worker):
    """Each rank holds a copy of a tiny model and scores its share of the batch."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.weight = torch.randn(4, generator=generator)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def score(self, data: DataProto) -> DataProto:
        scores = data.batch["features"] @ self.weight
        return DataProto.from_dict({"score": scores, "rank": torch.full_like(scores, self.rank)})

    @register(dispatch_mode=Dispatch.RANK_ZERO)
    def describe(self) -> str:
        return f"rank {self.rank} of {self.world_size}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", default=None)
    parser.add_argument("--world-size", type=int, default=2)
    args = parser.parse_args()
    batch = DataProto.from_dict({"features": torch.arange(40, dtype=torch.float32).reshape(10, 4)}, auto_padding=True)
    with WorkerGroup(Scorer, args.world_size, backend=args.backend) as wg:
        wg.init_model(seed=0)
        out = wg.score(batch)  # 10 rows split over the ranks (padded if uneven), concatenated back
        print(f"backend={wg.backend} world_size={wg.world_size} ({wg.describe()})")
        print("scores:", [round(v, 3) for v in out.batch["score"].tolist()])
        print("ranks: ", [int(v) for v in out.batch["rank"].tolist()])


if __name__ == "__main__":
    main()
