"""A user's worker: a toy linear policy trained data-parallel with the ``BALANCED`` mode."""

from __future__ import annotations

from typing import Any

import torch
from balanced_mode import BALANCED

from dispatchcore import PADDING_ROWS_KEY, DataProto, Dispatch, Worker, register


class PolicyWorker(Worker):
    """Each rank scores its rows with ``features @ w`` and takes one SGD step on them."""

    def __init__(self, dim: int = 4) -> None:
        self.w = torch.zeros(dim)
        self.lr = 0.0

    @register(Dispatch.ONE_TO_ALL)
    def init_model(self, lr: float) -> None:
        self.lr = lr

    @register(BALANCED)
    def update(self, data: DataProto) -> DataProto:
        """One step on this rank's rows; returns each row's loss before the step."""
        real = len(data) - data.meta_info.get(PADDING_ROWS_KEY, 0)
        x, y = data.batch["features"], data.batch["reward"]
        weight = data.batch["attention_mask"].sum(dim=-1).float()
        weight[real:] = 0.0  # padding rows must not train the model
        err = x @ self.w - y
        self.w -= self.lr * (weight * err) @ x / weight.sum().clamp(min=1.0)
        return DataProto.from_dict({"loss": err.square(), "rank": torch.full((len(data),), self.rank)})

    @register(Dispatch.ONE_TO_ALL)
    def state(self) -> dict[str, Any]:
        return {"w": self.w.clone()}

    @register(Dispatch.DP_COMPUTE)
    def load_state(self, state: dict[str, Any]) -> None:
        self.w = state["w"].clone()
