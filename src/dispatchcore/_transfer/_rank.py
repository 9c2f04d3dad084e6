"""The rank side of a weight transfer: offer, pack a bucket, receive and apply what arrives, commit.

The driver sends every step as the core's ``Operation.TRANSFER`` (named
:data:`TRANSFER_METHOD` in errors and traces), which ``WorkerHost`` hands
to :func:`run_step`.  A source rank reads its offered
tensors once per transfer (DTensors as the rows it holds, ``_dtensor``:
no transport ever sees one) and ``pack`` s each bucket it is sent as views
(a copy only where a cast or a column cut needs one); the executor's
:class:`TensorLink`, where it has one, moves them rank to rank, otherwise
they come back to the driver as the call's result.  A destination's
``move`` step is told how to apply (with its first step), starts receiving
one bucket into the places it lands (its rows of a buffer of the name's
wanted shape, from the process's buffer pool, or a lent tensor), then
applies the buckets the driver lists: those fetched before (so the next
bucket arrives while this one is applied) and, for its last bucket, that
one.  The version is set only at ``commit``, after the driver saw every
rank apply every bucket.  Each step returns its phases' times (``Span``)
for the report and the trace.  The ``*_sums`` steps checksum what sources
offered and destinations hold (``_checksum``) for ``WeightSync.verify``.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from .._base import DispatchAttributeError, DispatchError, DispatchRuntimeError, DispatchValueError
from .._wire import numpy_tensor
from ._checksum import destination_sums, source_sums
from ._dtensor import offered_record
from ._layout import Held, held_of, rows_view
from ._packing import pack, packed, places, unpack
from ._plan import Bucket, Piece, Wanted

#: What every transfer step's call is named in errors and traces (an ``Operation.TRANSFER``, no method).
TRANSFER_METHOD = "<weight transfer>"
#: The attribute a destination worker reads its last complete version from.
VERSION_ATTRIBUTE = "weights_version"

#: What a link's ``receive`` returns: wait for the bucket, get ``(tensors, shared)``.
Arrival = Callable[[], tuple[list[torch.Tensor], bool]]


class TensorLink(Protocol):
    """An executor's rank-to-rank path for a bucket's tensors (set as ``host.tensor_link``).

    ``publish`` runs on the source rank and returns a small token the driver
    forwards (as its own argument, so a Ray ``ObjectRef`` stays one).
    ``receive(token, into)`` runs on each destination rank: ``into[i]`` is
    a contiguous tensor of piece ``i``'s shape and dtype that the link fills
    with it (``None``: the link's own memory will do).  It may return before
    the bytes are there; the callable it returns waits for them and gives
    the tensors (``into[i]`` itself where one was given) and whether the
    link's own ones are memory others read too (``shared=True``: the core
    copies them unless the destination group is ``isolate=False``).
    ``same_process`` links take the pieces as views in the source dtype
    (their ``receive`` casts as it copies).
    """

    same_process: bool

    def publish(self, tensors: list[torch.Tensor], readers: int) -> Any: ...

    def receive(self, token: Any, into: list[torch.Tensor | None]) -> Arrival: ...


class TensorSourceLost(DispatchError, RuntimeError):
    """A destination could not read a bucket because the source rank that sent it is gone."""


#: One phase of one bucket on a rank: ``(phase, bucket index, start µs, end µs)``, wall clock.
Span = tuple[str, int, float, float]


def _now_us() -> float:
    return time.time_ns() / 1000.0


@dataclass
class _Transfer:
    """One transfer's state on one rank: offered tensors (source), buffers and arrivals (destination).

    Colocated roles in one process share it, as source and as destination.
    """

    offered: dict[str, tuple[torch.Tensor, Held]] = field(default_factory=dict)
    wanted: Mapping[str, Wanted] = field(default_factory=dict)
    #: The destination's apply method (``None``: the core's hand-over, kept in ``keep``).
    apply: str | None = ""
    #: Where a hand-over's tensors wait for ``Operation.HANDOVER`` (the rank's ``WorkerHost.handover``).
    keep: dict[str, torch.Tensor] = field(default_factory=dict)
    share: bool = False
    buffers: dict[str, torch.Tensor] = field(default_factory=dict)
    rows_in: dict[str, int] = field(default_factory=dict)
    done: set[str] = field(default_factory=set)
    #: The destination's own tensors that names land in (its ``lend`` method), by name.
    lent: dict[str, torch.Tensor] = field(default_factory=dict)
    #: Buckets fetched and not yet applied: the bucket, where its pieces land, the wait for them.
    arriving: dict[int, tuple[Bucket, list[torch.Tensor | None], Arrival]] = field(default_factory=dict)
    #: A source's pack spans, returned by ``end`` (a pack returns its token alone).
    spans: list[Span] = field(default_factory=list)


def run_step(host: Any, args: tuple[Any, ...]) -> Any:
    """One step on this rank (``args[0]`` names it); the step's value or an exception for the driver.

    Steps: ``layout``, ``pack`` and ``end`` on a source; ``want``,
    ``move`` and ``commit`` on a destination (the first of ``move`` and
    ``commit`` carries ``begin``: what the destination assembles and how it
    applies); the ``*_sums`` steps on both, and ``end`` after a failure.
    """
    step, tid = args[0][0], args[0][1]
    transfers: dict[int, _Transfer] = host.transfers
    if step == "end":  # the source's pack spans, if any
        ended = transfers.pop(tid, None)
        return [] if ended is None else ended.spans
    state = transfers.setdefault(tid, _Transfer())
    worker = host.worker
    if step == "layout":
        return _layout(worker, state, args[0][2])
    if step == "want":
        want = None if args[0][2] is None else getattr(worker, args[0][2], None)
        return {} if want is None else dict(want(args[0][3]))
    if step == "pack":
        return _pack(state, args[0][2], host.tensor_link)
    if step == "source_sums":
        return source_sums(state.offered, args[0][2])
    if step == "destination_sums":
        return destination_sums(worker, args[0][2], args[0][3], args[0][4])
    if step not in ("move", "commit"):
        raise DispatchValueError(f"unknown transfer step {step!r}")
    if args[0][3] is not None:  # the destination's first step of this transfer
        _begin(host, state, *args[0][3])
    if step == "move":
        return _move(worker, state, args[0][2], host.tensor_link, args[1], args[0][4])
    if not state.offered:  # commit: the destination's last step (a colocated source's end drops it)
        transfers.pop(tid, None)
    return _commit(worker, state, args[0][2])


def _begin(
    host: Any, state: _Transfer, wanted: Mapping[str, Wanted], apply: str | None, share: bool, lend: str | None
) -> None:
    """What the destination assembles and how it applies (``apply=None``: kept for the core's hand-over)."""
    state.wanted, state.apply, state.share = wanted, apply, share
    if apply is None:  # a failed hand-over's leftovers are dropped
        host.handover.clear()
        state.keep = host.handover
    state.lent = {} if lend is None else _lent(host.worker, wanted, lend)


def _hand(worker: Any, state: _Transfer, tensors: list[tuple[str, torch.Tensor]]) -> None:
    """Hand completed tensors to the destination's apply method, or keep them for the core's hand-over."""
    if state.apply is None:
        state.keep.update(tensors)
    else:
        getattr(worker, state.apply)(tensors)


def _layout(worker: Any, state: _Transfer, offer: str) -> dict[str, Held]:
    fn = getattr(worker, offer, None)
    if fn is None:
        raise DispatchAttributeError(f"{type(worker).__name__} has no method {offer!r} offering its weights")
    records = {name: offered_record(value, name) for name, value in dict(fn()).items()}
    # Every value is read before any is kept: one refused name leaves nothing half offered.
    state.offered = {name: held_of(record) for name, record in records.items() if record is not None}
    return {name: held for name, (_, held) in state.offered.items()}


def _source_view(state: _Transfer, piece: Piece, cast: bool) -> torch.Tensor:
    """The piece as a view of the offered tensor (cast and made contiguous when it leaves the process)."""
    tensor, held = state.offered[piece.source_name]
    t = rows_view(tensor, held.offset, piece.rows, piece.cut)
    if cast:
        t = t.to(piece.dtype).contiguous()
    return t.detach() if t.requires_grad else t


def _lent(worker: Any, wanted: Mapping[str, Wanted], lend: str) -> dict[str, torch.Tensor]:
    """The tensors the destination lends for names to land in, each checked against what arrives."""
    fn = getattr(worker, lend, None)
    if fn is None:
        return {}
    lent = dict(fn({name: (w.shape, w.dtype) for name, w in wanted.items()}) or {})
    for name, t in lent.items():
        w = wanted.get(name)
        if w is None:
            raise DispatchValueError(f"{lend} lends a tensor for {name!r}, which this transfer does not send")
        if tuple(t.shape) != w.shape or t.dtype != w.dtype or not t.is_contiguous() or t.device.type != "cpu":
            raise DispatchValueError(
                f"{lend} lends {name!r} as a {t.dtype} {tuple(t.shape)} tensor on {t.device} (contiguous: "
                f"{t.is_contiguous()}); it arrives as a contiguous CPU {w.dtype} {w.shape} tensor"
            )
    return lent


def _pack(state: _Transfer, bucket: Bucket, link: TensorLink | None) -> Any:
    """The bucket's token, alone (a Ray ``ObjectRef`` is handed over only as a whole result); its span is kept.

    Where no link moves them, the token is the tensors themselves: through the driver.
    """
    start = _now_us()
    cast = link is None or not link.same_process
    tensors = [_source_view(state, piece, cast) for piece in bucket.pieces]
    token = (
        tensors if link is None else link.publish(pack(bucket, packed(bucket, link), tensors), len(bucket.destinations))
    )
    state.spans.append(("pack", bucket.index, start, _now_us()))
    return token


def _slot(state: _Transfer, piece: Piece) -> torch.Tensor:
    """The piece's rows of its name's buffer (made on the first piece), in the piece's shape."""
    wanted = state.wanted[piece.name]
    buffer = state.buffers.get(piece.name)
    if buffer is None and piece.name in state.lent:
        buffer = state.buffers[piece.name] = state.lent[piece.name]  # the destination's own memory
    if buffer is None:
        # From the process's buffer pool: the last bucket's buffers, freed once applied, come back
        # without page faults (a fresh 256 MiB allocation costs 4-7x the copy, MEASURED.md).
        buffer = state.buffers[piece.name] = numpy_tensor(tuple(wanted.shape), wanted.dtype)
    if buffer.dim() == 0:
        return buffer
    return buffer.narrow(0, piece.rows[0] - wanted.rows[0], piece.rows[1] - piece.rows[0])


def _move(
    worker: Any, state: _Transfer, bucket: Bucket, link: TensorLink | None, token: Any, apply: list[int]
) -> list[Span]:
    """Start receiving ``bucket``, then apply the buckets listed (fetched before, or this one); the spans."""
    spans: list[Span] = []
    index = bucket.index
    try:
        start = _now_us()
        _fetch(state, bucket, link, token)
        spans.append(("move", index, start, _now_us()))
        for index in apply:
            spans.extend(_apply(worker, state, link, index))
    except TensorSourceLost as exc:  # which bucket's source: the driver names that rank
        source = state.arriving[index][0].source if index in state.arriving else bucket.source
        raise TensorSourceLost(f"{exc} [bucket {index} of source {source}]") from exc
    return spans


def _fetch(state: _Transfer, bucket: Bucket, link: TensorLink | None, token: Any) -> None:
    """Start receiving a bucket: each piece into its rows of its buffer, or whole where it may be kept."""
    into: list[torch.Tensor | None] = []
    for piece in bucket.pieces:
        whole = piece.rows == state.wanted[piece.name].rows and piece.name not in state.lent
        # A whole piece needs no buffer where the link's memory may be kept (isolate=False; driver: private).
        into.append(None if whole and (state.share or link is None) else _slot(state, piece))
    if link is None:
        tensors = list(token)  # the call's argument: this rank's own copy
        for t, x in zip(into, tensors, strict=True):
            if t is not None:
                t.copy_(x.reshape(t.shape))
        got = [x if t is None else t for t, x in zip(into, tensors, strict=True)]
        state.arriving[bucket.index] = (bucket, into, lambda: (got, False))
        return
    state.arriving[bucket.index] = (bucket, into, link.receive(token, places(packed(bucket, link), into)))


def _as_piece(x: torch.Tensor, piece: Piece) -> torch.Tensor:
    """A link's own tensor in the piece's shape; from another process it may come as its bytes, flat."""
    if tuple(x.shape) == piece.shape and x.dtype == piece.dtype:
        return x
    return x.reshape(-1).view(torch.uint8).view(piece.dtype).reshape(piece.shape)


def _apply(worker: Any, state: _Transfer, link: TensorLink | None, index: int) -> list[Span]:
    """Wait for a fetched bucket, then hand every tensor it completed to the apply hook; the spans."""
    start = _now_us()
    bucket, into, arrival = state.arriving[index]
    tensors, shared = arrival()
    tensors = unpack(bucket, packed(bucket, link), tensors, into)
    del state.arriving[index]
    arrived = _now_us()
    ready: list[tuple[str, torch.Tensor]] = []
    for piece, x, slot in zip(bucket.pieces, tensors, into, strict=True):
        wanted = state.wanted[piece.name]
        if slot is None:
            x = x if link is None or link.same_process else _as_piece(x, piece)
            if x.dtype == wanted.dtype and x.is_contiguous() and (not shared or state.share):
                ready.append((piece.name, x.reshape(wanted.shape)))  # the whole tensor, in memory it may keep
                state.done.add(piece.name)
                continue
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # a read-only source buffer is only read here
                _slot(state, piece).copy_(x.reshape(piece.shape))
        got = state.rows_in[piece.name] = state.rows_in.get(piece.name, 0) + piece.rows[1] - piece.rows[0]
        if got == wanted.rows[1] - wanted.rows[0]:
            ready.append((piece.name, state.buffers.pop(piece.name)))
            state.done.add(piece.name)
    if ready:
        _hand(worker, state, ready)
    return [("move", index, start, arrived), ("apply", index, arrived, _now_us())]


def _commit(worker: Any, state: _Transfer, version: Any) -> Any:
    """Give the empty tensors, check every name arrived, then (only then) set the version."""
    empty = [(n, torch.empty(w.shape, dtype=w.dtype)) for n, w in state.wanted.items() if w.numel == 0]
    if empty:
        _hand(worker, state, empty)
        state.done.update(n for n, _ in empty)
    missing = sorted(set(state.wanted) - state.done)
    if missing:
        raise DispatchRuntimeError(f"weights {missing[:5]} never arrived; version {version!r} not set")
    setattr(worker, VERSION_ATTRIBUTE, version)
    return version
