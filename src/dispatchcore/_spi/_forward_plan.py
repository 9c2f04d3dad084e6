"""Which rows of which rank's result each consuming rank gets when a ``DataProtoFuture`` is forwarded.

The core owns padding and chunking; the executor only moves the rows each :class:`ChunkPlan` names.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Mapping, Sequence

from .._base import BatchSizeError
from .._data import (
    AUTO_PADDING_KEY,
    PADDING_ROWS_KEY,
    DataProto,
    DataProtoConfig,
    kept_result_rows,
    merge_meta_info,
)
from ._row_pieces import ChunkPlan, ForwardPlan, ResultShape, RowPiece


def trimmed_rows(total: int, pad_size: int, padded_len: int) -> int:
    """Rows a collect keeps of ``total`` when dispatch added ``pad_size`` of ``padded_len``."""
    if pad_size <= 0:
        return total
    if padded_len and total % padded_len == 0:
        return total // padded_len * (padded_len - pad_size)
    return total - pad_size


def plan_forward(
    shapes: Sequence[ResultShape | None],
    chunks: int,
    *,
    collect_positions: Sequence[int] | None = None,
    pad_size: int = 0,
    padded_len: int = 0,
) -> ForwardPlan | None:
    """Chunk the producing call's collected result ``chunks`` ways, as row ranges; ``None``: resolve on the driver."""
    picked = list(range(len(shapes))) if collect_positions is None else list(collect_positions)
    described = [shapes[p] for p in picked]
    if chunks < 1 or not described or any(s is None for s in described):
        return None
    present = [s for s in described if s is not None]
    try:
        meta = merge_meta_info([s.meta_info for s in present])
    except ValueError:
        return None
    meta.pop(PADDING_ROWS_KEY, None)
    rows = [s.rows for s in present]
    try:
        total = kept_result_rows(rows, pad_size, padded_len)
    except BatchSizeError:  # resolved on the driver, whose collect refuses it naming the rank
        return None
    if total <= 0:
        return None
    pad = (-total) % chunks
    allow = bool(meta.get(AUTO_PADDING_KEY, False)) or DataProtoConfig.auto_padding
    if pad and not allow:
        return None
    size = (total + pad) // chunks
    starts = [0, *itertools.accumulate(rows)]
    plans = []
    for j in range(chunks):
        lo, hi = j * size, (j + 1) * size
        part_meta = copy.deepcopy(meta)
        if allow:
            part_meta[PADDING_ROWS_KEY] = max(0, hi - max(lo, total))
        plans.append(ChunkPlan(_pieces(lo, hi, total, starts, picked), part_meta))
    return ForwardPlan(plans, pad, total + pad)


def _pieces(lo: int, hi: int, total: int, starts: list[int], picked: list[int]) -> list[RowPiece]:
    """Row ranges covering virtual rows ``[lo, hi)``; rows past ``total`` wrap (padding repeats the start)."""
    out: list[RowPiece] = []
    row = lo
    while row < hi:
        real = row % total
        span = min(hi - row, total - real)
        pos = 0
        while starts[pos + 1] <= real:
            pos += 1
        take = min(span, starts[pos + 1] - real)
        out.append(RowPiece(picked[pos], real - starts[pos], real - starts[pos] + take))
        row += take
    return out


def assemble_chunk(plan: ChunkPlan, results: Mapping[int, DataProto]) -> DataProto:
    """Rank side: the chunk ``plan`` describes, from the results it reads (copied once: writable)."""
    pieces = []
    for piece in plan.pieces:
        part = results[piece.source][piece.start : piece.stop]
        part.meta_info = {}
        pieces.append(part)
    out = DataProto.concat(pieces)
    out.meta_info = copy.deepcopy(plan.meta_info)
    return out
