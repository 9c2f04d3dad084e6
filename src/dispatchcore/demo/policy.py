"""A tiny autoregressive policy over digits, small enough to train on 2 cores in seconds."""

from __future__ import annotations

import torch
from torch import nn

from .task import VOCAB

BOS = VOCAB  # the "previous token" of the first position


class TinyPolicy(nn.Module):
    """Next digit from (prompt digit at this position, previous digit, position)."""

    def __init__(self, length: int, hidden: int = 32) -> None:
        super().__init__()
        self.length = length
        self.prompt_digit = nn.Embedding(VOCAB, hidden)
        self.previous = nn.Embedding(VOCAB + 1, hidden)
        self.position = nn.Embedding(length, hidden)
        self.head = nn.Sequential(nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(), nn.Linear(hidden, VOCAB))

    def logits(self, prompts: torch.Tensor, responses: torch.Tensor) -> torch.Tensor:
        """Teacher-forced logits ``[batch, length, vocab]`` of ``responses``."""
        start = torch.full_like(responses[:, :1], BOS)
        previous = torch.cat([start, responses[:, :-1]], dim=1)
        positions = torch.arange(self.length, device=prompts.device)
        h = self.prompt_digit(prompts) + self.previous(previous) + self.position(positions)
        logits: torch.Tensor = self.head(h)
        return logits

    def log_probs(self, prompts: torch.Tensor, responses: torch.Tensor) -> torch.Tensor:
        """Sequence log-probability of each response, ``[batch]``."""
        logp = torch.log_softmax(self.logits(prompts, responses), dim=-1)
        return logp.gather(-1, responses.unsqueeze(-1)).squeeze(-1).sum(dim=1)

    @torch.no_grad()
    def generate(self, prompts: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """Sample a response digit by digit with the rank's own generator."""
        batch = prompts.shape[0]
        responses = torch.zeros(batch, self.length, dtype=torch.int64)
        previous = torch.full((batch,), BOS, dtype=torch.int64)
        for i in range(self.length):
            h = self.prompt_digit(prompts[:, i]) + self.previous(previous) + self.position.weight[i]
            probs = torch.softmax(self.head(h), dim=-1)
            token = torch.multinomial(probs, 1, generator=generator).squeeze(1)
            responses[:, i] = token
            previous = token
        return responses
