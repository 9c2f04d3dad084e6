"""The toy task: shift every digit of a prompt by a fixed amount.

Prompt ``[3, 9, 0, 4]`` with shift 3 has answer ``[6, 2, 3, 7]``.  A random
policy gets 10% of the digits right; the reward (fraction of digits right)
is checkable exactly, so a rising curve means the RL loop really learns.
"""

from __future__ import annotations

import torch

VOCAB = 10


def make_prompts(count: int, length: int, generator: torch.Generator) -> torch.Tensor:
    """``count`` random digit prompts of ``length`` digits."""
    return torch.randint(0, VOCAB, (count, length), generator=generator)


def rewards(prompts: torch.Tensor, responses: torch.Tensor, shift: int) -> torch.Tensor:
    """Per sequence: the fraction of digits equal to the shifted prompt digit."""
    return (responses == (prompts + shift) % VOCAB).float().mean(dim=1)
