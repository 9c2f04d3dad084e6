"""One rank's task for a call: which packed values it needs and where its arguments come from.

Shared by plain calls (``_executor``) and the compiled path (``_compiled``).
"""

from __future__ import annotations

from typing import Any

from dispatchcore.executor import Call

from ._tags import Layout


def rank_task(call: Call, unique: Any, encoded: list[Any], position: int) -> tuple[Layout, list[Any]]:
    """The layout and top-level values of one rank's task (``encoded`` from ``_payload.encode_all``)."""
    arg_slots = unique.arg_slots[position]
    kwarg_slots = unique.kwarg_slots[position]
    needed = sorted({*arg_slots, *kwarg_slots.values()})
    local = {slot: i for i, slot in enumerate(needed)}
    kinds: list[int] = []
    sources: list[Any] = []
    inline: list[Any] = []
    tops: list[Any] = []
    top_index: dict[int, int] = {}
    for slot in needed:
        kind, where, value = encoded[slot]
        kinds.append(kind)
        if where is None:
            sources.append(-1)
            inline.append(value)
            continue
        ref, member = where
        j = top_index.get(id(ref))
        if j is None:
            j = top_index[id(ref)] = len(tops)
            tops.append(ref)
        sources.append(j if member is None else (j, member))
        inline.append(None)
    layout: Layout = (
        tuple(local[s] for s in arg_slots),
        {k: local[s] for k, s in kwarg_slots.items()},
        tuple(kinds),
        tuple(sources),
        tuple(inline),
        call.instructions,
    )
    return layout, tops
