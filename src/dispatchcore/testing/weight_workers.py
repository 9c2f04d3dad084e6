"""Worker classes for ``WeightSync`` cases: a trainer holding shards, a rollout receiving them.

Importable, so every backend's ranks load them; weights are made from their
names (:func:`make_weights`), so the test process computes the same values.
"""

from __future__ import annotations

import os
import signal
import zlib
from collections.abc import Mapping
from typing import Any

import torch

from .. import Dispatch, Shard, Slice, Worker, register

WeightSpec = Mapping[str, tuple[tuple[int, ...], str]]

#: ``name: (shape, dtype name)``: odd sizes, a 0-dim tensor, an empty one, mixed dtypes.
WEIGHT_SET: dict[str, tuple[tuple[int, ...], str]] = {
    "embed": ((37, 6), "float32"),
    "layer.0.qkv": ((9, 5), "bfloat16"),
    "layer.0.bias": ((7,), "float16"),
    "layer.1.w": ((5, 3, 2), "float64"),
    "steps": ((3,), "int64"),
    "scale": ((), "float32"),
    "empty": ((0, 4), "float32"),
    "mask": ((4, 3), "bool"),
}


def make_weights(spec: WeightSpec = WEIGHT_SET, step: int = 0) -> dict[str, torch.Tensor]:
    """Deterministic tensors named by ``spec`` (the same in every process), different at each ``step``."""
    out = {}
    for name, (shape, dtype_name) in spec.items():
        g = torch.Generator().manual_seed(zlib.crc32(name.encode()) + step)
        dtype = getattr(torch, dtype_name)
        values = torch.randn(shape, generator=g) * 10
        out[name] = values > 0 if dtype == torch.bool else values.to(dtype)
    return out


def bounds(n: int, parts: int, index: int) -> tuple[int, int]:
    """Part ``index`` of ``n`` split in ``parts`` near-equal runs (uneven: the first ones longer)."""
    base, extra = divmod(n, parts)
    start = index * base + min(index, extra)
    return start, start + base + (1 if index < extra else 0)


class WeightTrainer(Worker):
    """Offers every weight: a dim-0 shard of each (``sharded``) or all of them whole."""

    def __init__(self, spec: WeightSpec | None = None, sharded: bool = True) -> None:
        self.spec = dict(WEIGHT_SET if spec is None else spec)
        self.sharded = sharded
        self.full = make_weights(self.spec)

    @register(Dispatch.ONE_TO_ALL)
    def set_step(self, step: int) -> int:
        self.full = make_weights(self.spec, step)
        return os.getpid()

    def weights(self) -> dict[str, torch.Tensor | Shard]:
        if not self.sharded:
            return dict(self.full)
        out: dict[str, torch.Tensor | Shard] = {}
        for name, t in self.full.items():
            if t.dim() == 0:
                out[name] = t
                continue
            lo, hi = bounds(t.shape[0], self.world_size, self.rank)
            out[name] = Shard(t[lo:hi], lo, tuple(t.shape))
        return out


class WeightRollout(Worker):
    """Keeps what arrives; asks for a slice of every tensor along ``cut`` (split over its ranks) if set."""

    def __init__(self) -> None:
        self.configure()

    @register(Dispatch.ONE_TO_ALL)
    def configure(self, cut: int | None = None, die_on: int | None = None, kill: tuple[int, int] | None = None) -> int:
        """``die_on``: exit on that apply call; ``kill=(pid, k)``: SIGKILL ``pid`` on apply call ``k``."""
        self.cut, self.die_on, self.kill = cut, die_on, kill
        self.received: dict[str, torch.Tensor] = {}
        self.buckets = 0
        return self.rank

    def weight_slices(self, shapes: Mapping[str, tuple[tuple[int, ...], torch.dtype]]) -> dict[str, Slice]:
        if self.cut is None:
            return {}
        out = {}
        for name, (shape, _) in shapes.items():
            if len(shape) > self.cut:
                out[name] = Slice(self.cut, *bounds(shape[self.cut], self.world_size, self.rank))
        return out

    def load_weights(self, weights: list[tuple[str, torch.Tensor]]) -> None:
        if self.die_on is not None and self.buckets == self.die_on and self.rank == self.world_size - 1:
            os._exit(3)
        if self.kill is not None and self.buckets == self.kill[1] and self.rank == 0:
            os.kill(self.kill[0], signal.SIGKILL)
        self.buckets += 1
        for name, t in weights:
            if name in self.received:
                raise AssertionError(f"{name!r} arrived twice")
            self.received[name] = t.clone()

    @register(Dispatch.ONE_TO_ALL)
    def state(self) -> tuple[dict[str, torch.Tensor], Any, int]:
        return self.received, getattr(self, "weights_version", None), self.buckets


def expected(full: torch.Tensor, cut: int | None, rank: int, world: int) -> torch.Tensor:
    """What rank ``rank`` of ``world`` destination ranks should hold of ``full`` (see ``weight_slices``)."""
    if cut is None or full.dim() <= cut:
        return full
    lo, hi = bounds(full.shape[cut], world, rank)
    return full.narrow(cut, lo, hi - lo)
