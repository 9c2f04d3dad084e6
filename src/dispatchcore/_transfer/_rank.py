"""The rank side of a weight transfer: offer, pack a bucket, assemble and apply what arrives, commit.

The driver sends every step as a call of :data:`TRANSFER_METHOD`, which
``WorkerHost`` hands to :func:`run_step`.  A source rank reads its offered
tensors once per transfer and sends each bucket's pieces as views (a copy
only where a cast or a column cut needs one); the executor's
:class:`TensorLink`, where it has one, moves them rank to rank, otherwise
they come back to the driver as the call's result.  A destination rank
assembles each name in a buffer of its wanted shape (skipped when one
arriving piece is the whole tensor and private memory), hands the tensors
a bucket completed to the apply hook, and learns its new version only at
``commit``, after the driver saw every rank apply every bucket.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from .._wire import numpy_tensor
from ._layout import Held, held_of
from ._plan import Bucket, Piece, Wanted

#: The method name of every transfer step (no worker method may be called so).
TRANSFER_METHOD = "__dispatchcore_transfer__"
#: The attribute a destination worker reads its last complete version from.
VERSION_ATTRIBUTE = "weights_version"


class TensorLink(Protocol):
    """An executor's rank-to-rank path for a bucket's tensors (set as ``host.tensor_link``).

    ``publish`` runs on the source rank and returns a small token the driver
    forwards (as its own argument, so a Ray ``ObjectRef`` stays one);
    ``receive`` runs on each destination rank and gives the tensors back,
    with ``shared=True`` where they are memory others read too (the core
    then copies them unless the destination group is ``isolate=False``).
    ``same_process`` links take the pieces as views in the source dtype.
    """

    same_process: bool

    def publish(self, tensors: list[torch.Tensor], readers: int) -> Any: ...

    def receive(self, token: Any) -> tuple[list[torch.Tensor], bool]: ...


class TensorSourceLost(RuntimeError):
    """A destination could not read a bucket because the source rank that sent it is gone."""


@dataclass
class _Transfer:
    """One transfer's state on one rank: offered tensors (source), partial buffers (destination)."""

    offered: dict[str, tuple[torch.Tensor, Held]] = field(default_factory=dict)
    wanted: Mapping[str, Wanted] = field(default_factory=dict)
    apply: str = ""
    share: bool = False
    buffers: dict[str, torch.Tensor] = field(default_factory=dict)
    rows_in: dict[str, int] = field(default_factory=dict)
    done: set[str] = field(default_factory=set)


def run_step(host: Any, args: tuple[Any, ...]) -> Any:
    """One step on this rank (``args[0]`` names it); the step's value or an exception for the driver."""
    step, tid = args[0][0], args[0][1]
    transfers: dict[int, _Transfer] = host.transfers
    if step == "end":
        transfers.pop(tid, None)
        return None
    state = transfers.setdefault(tid, _Transfer())
    worker = host.worker
    if step == "layout":
        return _layout(worker, state, args[0][2])
    if step == "want":
        want = getattr(worker, args[0][2], None)
        return {} if want is None else dict(want(args[0][3]))
    if step == "begin":
        state.wanted, state.apply, state.share = args[0][2], args[0][3], args[0][4]
        return None
    if step == "pack":
        return _pack(state, args[0][2], host.tensor_link)
    if step == "apply":
        return _apply(worker, state, args[0][2], host.tensor_link, args[1])
    if step == "commit":
        return _commit(worker, state, args[0][2])
    raise ValueError(f"unknown transfer step {step!r}")


def _layout(worker: Any, state: _Transfer, offer: str) -> dict[str, Held]:
    fn = getattr(worker, offer, None)
    if fn is None:
        raise AttributeError(f"{type(worker).__name__} has no method {offer!r} offering its weights")
    offered = fn()
    state.offered = {name: held_of(value, name) for name, value in dict(offered).items()}
    return {name: held for name, (_, held) in state.offered.items()}


def _source_view(state: _Transfer, piece: Piece, cast: bool) -> torch.Tensor:
    """The piece as a view of the offered tensor (cast and made contiguous when it leaves the process)."""
    tensor, held = state.offered[piece.source_name]
    t = tensor.reshape(1) if tensor.dim() == 0 else tensor
    t = t.narrow(0, piece.rows[0] - held.offset, piece.rows[1] - piece.rows[0])
    if piece.cut is not None:
        t = t.narrow(piece.cut.dim, piece.cut.start, piece.cut.stop - piece.cut.start)
    if not piece.shape:
        t = t.reshape(())
    if cast:
        t = t.detach().to(piece.dtype).contiguous()
    return t.detach()


def _pack(state: _Transfer, bucket: Bucket, link: TensorLink | None) -> Any:
    cast = link is None or not link.same_process
    tensors = [_source_view(state, piece, cast) for piece in bucket.pieces]
    if link is None:
        return tensors  # the call's result: through the driver
    return link.publish(tensors, len(bucket.destinations))


def _as_piece(x: torch.Tensor, piece: Piece, as_sent: bool) -> torch.Tensor:
    """An arriving tensor in the piece's shape; from another process it may come as its bytes, flat."""
    if as_sent or (tuple(x.shape) == piece.shape and x.dtype == piece.dtype):
        return x
    return x.reshape(-1).view(torch.uint8).view(piece.dtype).reshape(piece.shape)


def _apply(worker: Any, state: _Transfer, bucket: Bucket, link: TensorLink | None, token: Any) -> int:
    """Place a bucket's pieces, then hand every tensor it completed to the apply hook; how many it gave."""
    if link is None:
        tensors, shared = list(token), False
    else:
        tensors, shared = link.receive(token)
    ready: list[tuple[str, torch.Tensor]] = []
    as_sent = link is not None and link.same_process
    for piece, x in zip(bucket.pieces, tensors, strict=True):
        x = _as_piece(x, piece, as_sent)
        wanted = state.wanted[piece.name]
        whole = piece.rows == wanted.rows and x.dtype == wanted.dtype and x.is_contiguous()
        if whole and (not shared or state.share):
            ready.append((piece.name, x.reshape(wanted.shape)))  # the whole tensor, in memory it may keep
            state.done.add(piece.name)
            continue
        buffer = state.buffers.get(piece.name)
        if buffer is None:
            # From the process's buffer pool: the last bucket's buffers, freed once applied, come back
            # without page faults (a fresh 256 MiB allocation costs 4-7x the copy, MEASURED.md).
            buffer = state.buffers[piece.name] = numpy_tensor(tuple(wanted.shape), wanted.dtype)
        flat = buffer.reshape(1) if buffer.dim() == 0 else buffer
        target = flat.narrow(0, piece.rows[0] - wanted.rows[0], piece.rows[1] - piece.rows[0])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a read-only source buffer is only read here
            target.copy_(x.reshape(target.shape))
        got = state.rows_in[piece.name] = state.rows_in.get(piece.name, 0) + piece.rows[1] - piece.rows[0]
        if got == wanted.rows[1] - wanted.rows[0]:
            ready.append((piece.name, state.buffers.pop(piece.name)))
            state.done.add(piece.name)
    if ready:
        getattr(worker, state.apply)(ready)
    return len(ready)


def _commit(worker: Any, state: _Transfer, version: Any) -> Any:
    """Give the empty tensors, check every name arrived, then (only then) set the version."""
    empty = [(n, torch.empty(w.shape, dtype=w.dtype)) for n, w in state.wanted.items() if w.numel == 0]
    if empty:
        getattr(worker, state.apply)(empty)
        state.done.update(n for n, _ in empty)
    missing = sorted(set(state.wanted) - state.done)
    if missing:
        raise RuntimeError(f"weights {missing[:5]} never arrived; version {version!r} not set")
    setattr(worker, VERSION_ATTRIBUTE, version)
    return version
