"""One call envelope: what a rank receives for a call, each distinct argument pickled once, before any send.

A value travels inline or by the executor's :class:`BulkPath` (``docs/executor-contract.md``, "The lane").
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from typing import Any, NamedTuple, Protocol

from .._base import DispatchRuntimeError
from .._runtime import unpicklable_error
from .._spi import Call
from .._wire import INLINE_LIMIT, Serialized, dumps, loads

#: A value on the lane: ``(stream, buffers)`` inline, or ``(None, token)`` by the bulk path.
Part = tuple[Any, Any]
#: What one rank of a call receives besides the method: its parts and where each argument comes from.
RankValues = tuple[list[Part], tuple[int, ...], dict[str, int]]
_NONE: RankValues = ([], (), {})


class BulkPath(Protocol):
    """A way for large values to move beside the lane link, which an executor may offer (Ray's object store).

    An argument: the driver calls :meth:`put` with the ranks that read it,
    each rank :meth:`get` with the token from its envelope.  A result: the
    rank calls :meth:`put` with no ranks, the driver :meth:`get`.  Optional:
    ``claims(value) -> bool`` names values the path moves as they are, never
    pickled (:meth:`get` returns a :class:`HandedOver`); ``flush()`` runs on
    the driver once every value of a call was put, before the call is sent.
    """

    #: Values whose pickle (stream and buffers) has at least this many bytes go by this path.
    min_bytes: int
    #: Whether :meth:`get` hands back memory the rank owns and may write (else it is copied unless isolate=False).
    private: bool

    def put(self, value: Serialized, ranks: tuple[int, ...]) -> Any:
        """Start moving ``value`` to ``ranks`` (none: to the driver); a small picklable token the reader gets."""
        ...

    def get(self, token: Any) -> Serialized | HandedOver:
        """The value :meth:`put` moved under ``token`` (a rank's argument, or the driver's result)."""
        ...


class HandedOver(NamedTuple):
    """A value a bulk path moved as it is, never pickled: what its ``get`` returns for a claimed value."""

    value: Any


def claimed(bulk: BulkPath | None, value: Any) -> bool:
    """Whether ``bulk`` moves ``value`` as it is (its optional ``claims``)."""
    claims = getattr(bulk, "claims", None)
    return claims is not None and bool(claims(value))


def to_part(value: Serialized, bulk: BulkPath | None = None, ranks: tuple[int, ...] = ()) -> Part:
    """``value`` as a part: by the bulk path when there is one and it is large enough, else inline."""
    if bulk is not None and value.nbytes >= bulk.min_bytes:
        return None, bulk.put(value, ranks)
    return inline(value)


def is_bulk(part: Part | None) -> bool:
    """Whether ``part`` went by the bulk path (the reader must not wait for it)."""
    return part is not None and part[0] is None


def inline(value: Serialized) -> Part:
    """``value`` as an inline part (a long pickle stream goes out of band too, not copied into the frame)."""
    data = value.data
    return (pickle.PickleBuffer(data) if len(data) > INLINE_LIMIT else data), value.buffers


def pack_call(call: Call, bulk: BulkPath | None = None) -> list[RankValues]:
    """Each rank's parts and slots for ``call``; raises ``UnpicklableError`` before anything moves."""
    if not any(call.args) and not any(call.kwargs):
        return [_NONE] * len(call.ranks)
    unique = call.unique_values()
    as_is = [claimed(bulk, value) for value in unique.values]
    # every one before the first send
    pickled = [value if keep else _pickle(value, call.method) for value, keep in zip(unique.values, as_is, strict=True)]
    used = [sorted({*a, *k.values()}) for a, k in zip(unique.arg_slots, unique.kwarg_slots, strict=True)]
    parts = [
        (None, bulk.put(value, _readers(slot, used, call.ranks)))  # type: ignore[union-attr]
        if as_is[slot]
        else to_part(value, bulk, _readers(slot, used, call.ranks))
        for slot, value in enumerate(pickled)
    ]
    flush = getattr(bulk, "flush", None)
    if flush is not None:  # a bulk path may move a call's values together (one object for all)
        flush()
    out: list[RankValues] = []
    for position, slots in enumerate(used):
        index = {slot: i for i, slot in enumerate(slots)}
        args = tuple(index[s] for s in unique.arg_slots[position])
        kwargs = {k: index[s] for k, s in unique.kwarg_slots[position].items()}
        out.append(([parts[s] for s in slots], args, kwargs))
    return out


def _pickle(value: Any, method: str) -> Serialized:
    try:
        return dumps(value)
    except Exception as exc:
        raise unpicklable_error(method, value, exc) from exc


def _readers(slot: int, used: list[list[int]], ranks: Sequence[int]) -> tuple[int, ...]:
    """The ranks whose arguments use value ``slot``."""
    return tuple(rank for rank, slots in zip(ranks, used, strict=True) if slot in slots)


def open_part(part: Part | None, bulk: BulkPath | None = None, isolate: bool = True) -> Any:
    """The value in ``part`` (``None`` for no part); inline buffers are already this process's own memory."""
    if part is None:
        return None
    stream, payload = part
    if stream is None:
        if bulk is None:
            raise DispatchRuntimeError("a value came by a bulk path, but this rank was given none")
        got = bulk.get(payload)
        return got.value if isinstance(got, HandedOver) else loads(got, copy=isolate and not bulk.private)
    return loads(Serialized(stream, payload), copy=False)


def open_values(values: RankValues, bulk: BulkPath | None, isolate: bool) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """A rank's arguments from its :func:`pack_call` share."""
    parts, arg_slots, kwarg_slots = values
    if not parts:
        return (), {}
    opened = [open_part(part, bulk, isolate) for part in parts]
    return tuple(opened[i] for i in arg_slots), {k: opened[i] for k, i in kwarg_slots.items()}
