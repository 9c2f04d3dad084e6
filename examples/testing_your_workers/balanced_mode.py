"""A user's own dispatch mode: rows dealt to the ranks by token count.

``DP_COMPUTE_PROTO`` gives rank i rows ``i*k .. (i+1)*k``; with rollouts of
very different lengths one rank gets the long ones and the others wait.
``BALANCED`` sorts rows by their number of tokens (``attention_mask``) and
deals them longest first, round robin, so every rank gets a similar load.
Collect puts the rows back in input order and drops the padding rows.
Dispatch and collect run on the driver only, so this works on every backend.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dispatchcore import (
    PADDING_ROWS_KEY,
    BatchSizeError,
    DataProto,
    concat_outputs,
    current_call,
    register_dispatch_mode,
)

TOKENS = "attention_mask"


def row_tokens(data: DataProto) -> np.ndarray:
    """Tokens per row: the row sums of ``attention_mask``."""
    return data.batch[TOKENS].sum(dim=-1).numpy().astype(np.int64)


def deal(tokens: np.ndarray, world_size: int) -> list[np.ndarray]:
    """Row indices for each rank: longest rows first, dealt round robin."""
    order = np.argsort(-tokens, kind="stable")
    return [order[rank::world_size] for rank in range(world_size)]


def dispatch_balanced(wg: Any, data: DataProto) -> tuple[tuple[list[DataProto]], dict[str, Any]]:
    n = wg.world_size
    length = len(data)
    pad = (-length) % n
    if pad and not data.is_padding_enabled():
        raise BatchSizeError(
            f"BALANCED cannot split {length} rows over {n} ranks evenly; build the batch with auto_padding=True"
        )
    hands = deal(row_tokens(data), n)
    size = (length + pad) // n
    chunks = []
    for rows in hands:
        padding = size - len(rows)  # this rank's share of the padding rows: copies of row 0
        chunk = data.select_idxs(np.concatenate([rows, np.zeros(padding, dtype=np.int64)]))
        if data.is_padding_enabled():
            chunk.meta_info[PADDING_ROWS_KEY] = padding
        chunks.append(chunk)
    current_call().extra["balanced_hands"] = hands
    return (chunks,), {}


def collect_balanced(wg: Any, outputs: list[DataProto]) -> DataProto:
    hands = current_call().extra["balanced_hands"]
    real = [out[: len(rows)] for out, rows in zip(outputs, hands, strict=True)]  # padding rows are trailing
    joined = concat_outputs(real)
    joined.meta_info.pop(PADDING_ROWS_KEY, None)
    dealt = np.concatenate(hands)
    where = np.empty(len(dealt), dtype=np.int64)
    where[dealt] = np.arange(len(dealt))  # input row i is row where[i] of joined
    return joined.select_idxs(where)


BALANCED = register_dispatch_mode("BALANCED", dispatch_balanced, collect_balanced)
