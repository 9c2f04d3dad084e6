"""Padding is trimmed rank by rank: a rank that drops its own padding loses no real rows (issue 40, item 3).

Rank i gets L rows, p of them padding: L back -> p trimmed; k*L back -> k*p trimmed; L-p back -> kept
whole; anything else with padding sent is refused naming the rank and the counts; without padding any count.
"""

from __future__ import annotations

import pytest
import torch

from dispatchcore import BatchSizeError, DataProto, Dispatch, Worker, WorkerGroup, register
from dispatchcore.executor import ResultShape, plan_forward


def _batch(n: int) -> DataProto:
    return DataProto.from_dict({"x": torch.arange(n)}, auto_padding=True)


class Rows(Worker):
    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def echo(self, data: DataProto) -> DataProto:
        return data

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def real_only(self, data: DataProto) -> DataProto:
        # What verl users write: drop this chunk's padding before returning.
        return data[: len(data) - data.meta_info.get("padding_rows", 0)]

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def three_each(self, data: DataProto) -> DataProto:
        return data.repeat(3, interleave=True)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def first_row(self, data: DataProto) -> DataProto:
        return data[:1]

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def filtered(self, data: DataProto) -> DataProto:
        return data[data.batch["x"] % 2 == 0]


@pytest.fixture(scope="module")
def wg2():
    with WorkerGroup(Rows, 2, backend="local") as group:
        yield group


@pytest.fixture(scope="module")
def wg4():
    with WorkerGroup(Rows, 4, backend="local") as group:
        yield group


@pytest.mark.parametrize("n", [5, 21, 7])
def test_a_rank_that_drops_its_own_padding_loses_no_rows(wg2, wg4, n: int) -> None:
    for wg in (wg2, wg4):
        out = wg.real_only(_batch(n))
        assert out.batch["x"].tolist() == list(range(n))


@pytest.mark.parametrize("n", [5, 21])
def test_one_row_per_row_sent_is_trimmed_to_the_input(wg4, n: int) -> None:
    assert wg4.echo(_batch(n)).batch["x"].tolist() == list(range(n))


def test_expansions_are_trimmed_by_padding_times_k(wg4) -> None:
    out = wg4.three_each(_batch(5))  # 8 rows sent, 3 of them padding on ranks 2 and 3
    assert out.batch["x"].tolist() == [i for i in range(5) for _ in range(3)]


def test_a_count_that_fits_no_rule_names_rank_and_counts(wg4) -> None:
    # 5 rows on 4 ranks: 2 rows each; rank 2 has 1 padding row (1 back: its real row, fine), rank 3 has 2.
    with pytest.raises(BatchSizeError) as info:
        wg4.first_row(_batch(5))
    message = str(info.value)
    assert "first_row" in message and "rank 3 was sent 2 rows" in message and "returned 1" in message


def test_without_padding_any_count_is_fine(wg4) -> None:
    data = DataProto.from_dict({"x": torch.arange(8)})
    assert wg4.filtered(data).batch["x"].tolist() == [0, 2, 4, 6]
    assert wg4.first_row(data).batch["x"].tolist() == [0, 2, 4, 6]


def test_forwarded_futures_follow_the_same_rule() -> None:
    # 5 rows padded to 6 over 2 ranks; rank 1 returned only its 2 real rows.
    plan = plan_forward([ResultShape(3), ResultShape(2)], 1, pad_size=1, padded_len=6)
    assert plan is not None and plan.padded_len == 5
    assert plan_forward([ResultShape(3), ResultShape(1)], 1, pad_size=1, padded_len=6) is None
