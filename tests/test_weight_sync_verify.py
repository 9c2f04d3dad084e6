"""``verify=True`` digests as the transfer goes (issue 43), and local's one copy never hands the source's tensor over.

The sending source digests each piece as it packs it; each destination
digests a name from what its ``weights`` method returns right after its
``load_weights`` took the name whole (a name split over buckets: after its
last).  These check what that promises on local threads, self-started
torchrun and the driver path (the ``multiprocess`` example): equal bytes
pass, other bytes (a matrix's values in other places, a name
``load_weights`` never stored) and replicas that disagree
are caught before the version moves.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

from dispatchcore import Dispatch, RowShard, WeightMismatchError, WeightSync, Worker, WorkerGroup, register

pytestmark = pytest.mark.timeout(180)

#: A matrix over the checksum's small-region bound (block sums; bfloat16 halves at an offset of 131,070
#: bytes, not a multiple of 8), a small one (CRC-32), a vector.
SHAPES = {"big": ((513, 255), torch.bfloat16), "small": ((8, 8), torch.float32), "bias": ((300,), torch.float32)}


def full() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(43)
    return {name: torch.randn(shape, generator=g).to(dtype) for name, (shape, dtype) in SHAPES.items()}


class Holder(Worker):
    """A source rank: dim-0 halves of every tensor, or (``whole``) every tensor, rank 1's ``skew`` changed."""

    @register(Dispatch.ONE_TO_ALL)
    def configure(self, whole: bool = False, skew: str | None = None) -> int:
        self.held: dict[str, Any] = {}
        for name, t in full().items():
            if whole:
                mine = t.clone()
                if name == skew and self.rank == 1:
                    mine.view(-1)[0] += 1
                self.held[name] = mine
                continue
            half = (t.shape[0] + 1) // 2
            lo, hi = (0, half) if self.rank == 0 else (half, t.shape[0])
            self.held[name] = RowShard(t[lo:hi].clone(), lo, tuple(t.shape))
        return 0

    def weights(self) -> dict[str, Any]:
        return self.held

    @register(Dispatch.ONE_TO_ALL)
    def storages(self) -> list[int]:
        held = [v.tensor if isinstance(v, RowShard) else v for v in self.held.values()]
        return [t.untyped_storage().data_ptr() for t in held]


class Keeper(Worker):
    """A destination rank: ``load_weights`` copies (``copy``), keeps lent tensors (``lent``) or goes wrong."""

    @register(Dispatch.ONE_TO_ALL)
    def configure(self, mode: str = "copy") -> int:
        self.mode, self.seen = mode, []
        self.params = {name: torch.zeros(shape, dtype=dtype) for name, (shape, dtype) in SHAPES.items()}
        return 0

    def weight_buffers(self, shapes: dict[str, Any]) -> dict[str, torch.Tensor]:
        return self.params if self.mode == "lent" else {}

    def load_weights(self, weights: list[tuple[str, torch.Tensor]]) -> None:
        for name, t in weights:
            self.seen.append(t.untyped_storage().data_ptr())
            if self.mode == "reorder" and t.dim() == 2:
                t = t.reshape(-1).flip(0).reshape(t.shape)  # the same values, other places: a layout mistake
            if self.mode == "drop" and name == "bias":
                continue  # never stored
            self.params[name].copy_(t)

    def weights(self) -> dict[str, torch.Tensor]:
        return self.params

    @register(Dispatch.ONE_TO_ALL)
    def state(self) -> tuple[dict[str, torch.Tensor], Any, list[int], list[int]]:
        """What it holds, its version, the storages ``load_weights`` got and its parameters' storages."""
        own = [p.untyped_storage().data_ptr() for p in self.params.values()]
        return self.params, getattr(self, "weights_version", None), self.seen, own


@pytest.fixture(scope="module", params=["local", "torchrun", "multiprocess"])
def groups(request: pytest.FixtureRequest) -> Iterator[tuple[WorkerGroup[Any], WorkerGroup[Any]]]:
    with (
        WorkerGroup(Holder, 2, backend=request.param) as src,
        WorkerGroup(Keeper, 2, backend=request.param) as dst,
    ):
        yield src, dst


def _hold_the_full_weights(dst: WorkerGroup[Any], version: Any) -> None:
    for params, seen, _, _ in dst.state():
        assert seen == version
        for name, t in full().items():
            assert torch.equal(params[name], t), name


@pytest.mark.parametrize("mode", ["copy", "lent"])
def test_verify_passes_equal_bytes_split_over_buckets(groups: Any, mode: str) -> None:
    """A name split over buckets is read back once ``load_weights`` took it whole, not before."""
    src, dst = groups
    src.configure()
    dst.configure(mode)
    sync = WeightSync(src, dst, bucket_bytes=64 << 10, verify=True)
    report = sync(version=1)
    assert report.verified and report.buckets > 2 and report.phases["digest"] > 0
    assert any(len({p.name for p in b.pieces}) == 1 for b in sync.last_plan.buckets)  # "big" spans buckets
    _hold_the_full_weights(dst, 1)
    assert sync.verify() == sorted(SHAPES)


@pytest.mark.parametrize(("mode", "name"), [("reorder", "big"), ("reorder", "small"), ("drop", "bias")])
def test_verify_catches_bytes_load_weights_left_otherwise(groups: Any, mode: str, name: str) -> None:
    src, dst = groups
    src.configure()
    dst.configure("copy")
    WeightSync(src, dst)(version=1)
    dst.configure(mode)
    with pytest.raises(WeightMismatchError, match=rf"'{name}' on destination rank \d \(other bytes") as info:
        WeightSync(src, dst, bucket_bytes=64 << 10, verify=True)(version=2)
    assert name in {n for n, _, _ in info.value.mismatches}
    assert [seen for _, seen, _, _ in dst.state()] == [1, 1]  # checked before the version: it never moved


def test_verify_catches_replicas_that_differ(groups: Any) -> None:
    """Both source ranks hold every tensor whole; the one that did not send a region digests it too."""
    src, dst = groups
    src.configure(whole=True, skew="small")
    dst.configure("copy")
    with pytest.raises(WeightMismatchError, match=r"'small' \(source ranks \[0, 1\] hold different bytes") as info:
        WeightSync(src, dst, verify=True)(version=1)
    assert ("small", -1) in {(n, r) for n, r, _ in info.value.mismatches}


def test_local_copies_and_never_hands_the_sources_tensors_over() -> None:
    """Isolated local ranks (the default) get each byte copied once, into memory of their own."""
    with WorkerGroup(Holder, 2, backend="local") as src, WorkerGroup(Keeper, 2, backend="local") as dst:
        src.configure(whole=True)  # whole tensors: the case a view could be handed over
        owned = {ptr for ptrs in src.storages() for ptr in ptrs}
        for mode in ("copy", "lent"):
            dst.configure(mode)
            WeightSync(src, dst)(version=mode)
            _hold_the_full_weights(dst, mode)
            for _, _, seen, own in dst.state():
                assert seen and not owned & set(seen)
                if mode == "lent":  # lent: landed straight in the parameters, applied as them
                    assert set(seen) == set(own)
