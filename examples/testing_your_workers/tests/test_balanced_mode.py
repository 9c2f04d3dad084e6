"""The custom mode, held to the dispatch properties with the testing kit (no group, no ranks)."""

from __future__ import annotations

import torch
from balanced_mode import BALANCED, TOKENS, deal, row_tokens
from hypothesis import given, settings
from hypothesis import strategies as st

from dispatchcore import DataProto
from dispatchcore.testing import check_dispatch_mode, dataprotos, world_sizes


@st.composite
def rollouts(draw: st.DrawFn, max_len: int = 40) -> DataProto:
    """Any batch ``dataprotos()`` draws, plus the ``attention_mask`` BALANCED deals by."""
    data = draw(dataprotos(max_len=max_len, auto_padding=None))
    lengths = draw(st.lists(st.integers(0, 8), min_size=len(data), max_size=len(data)))
    data.batch[TOKENS] = (torch.arange(8) < torch.tensor(lengths, dtype=torch.long).reshape(-1, 1)).long()
    return data


def test_balanced_keeps_order_padding_and_every_row() -> None:
    check_dispatch_mode(BALANCED, batches=rollouts(), max_examples=60)


def test_balanced_also_takes_the_batch_by_keyword() -> None:
    check_dispatch_mode(BALANCED, batches=rollouts(), keyword="data", max_examples=20)


@settings(deadline=None, max_examples=60)
@given(rollouts(), world_sizes(1, 8))
def test_balanced_spreads_tokens_within_one_row(data: DataProto, n: int) -> None:
    tokens = row_tokens(data)
    loads = [int(tokens[hand].sum()) for hand in deal(tokens, n)]
    assert max(loads) - min(loads) <= (int(tokens.max()) if len(tokens) else 0)
