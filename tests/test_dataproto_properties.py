"""Hypothesis properties of DataProto's row operations."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from dispatchcore import (
    PADDING_ROWS_KEY,
    BatchSizeError,
    DataProto,
    chunk_with_padding,
    pad_dataproto_to_divisor,
    unpad_dataproto,
)
from dispatchcore.testing.assertions import values_equal
from dispatchcore.testing.strategies import assert_dataproto_equal, dataprotos, world_sizes
from dispatchcore.wire import dumps, loads

# assume() keeps only lengths the world size divides (about one draw in four).
FAST = settings(
    deadline=None, max_examples=40, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much]
)
WORLD = world_sizes()


def snapshot(data: DataProto) -> DataProto:
    """A private deep copy to check later that ``data`` was left alone."""
    return copy.deepcopy(data)


@FAST
@given(dataprotos(max_len=64), WORLD)
def test_chunk_concat_round_trip_when_divisible(data: DataProto, n: int) -> None:
    assume(len(data) % n == 0)
    chunks = data.chunk(n)
    assert len(chunks) == n and len({len(c) for c in chunks}) == 1
    assert_dataproto_equal(DataProto.concat(chunks), data)


@FAST
@given(dataprotos(max_len=64), WORLD)
def test_chunk_without_padding_refuses_uneven(data: DataProto, n: int) -> None:
    assume(len(data) % n != 0)
    with pytest.raises(BatchSizeError):
        data.chunk(n)


@FAST
@given(dataprotos(max_len=64, auto_padding=True), WORLD)
def test_padded_chunks(data: DataProto, n: int) -> None:
    before = snapshot(data)
    chunks, pad_size = chunk_with_padding(data, n)
    assert pad_size == (-len(data)) % n
    assert len({len(c) for c in chunks}) == 1
    assert sum(c.meta_info[PADDING_ROWS_KEY] for c in chunks) == pad_size
    for c in chunks:
        assert 0 <= c.meta_info[PADDING_ROWS_KEY] <= len(c)
    joined = DataProto.concat(chunks)
    assert PADDING_ROWS_KEY not in joined.meta_info
    assert_dataproto_equal(unpad_dataproto(joined, pad_size), data)
    assert_dataproto_equal(data, before)


@FAST
@given(dataprotos(max_len=64), WORLD)
def test_pad_then_unpad(data: DataProto, n: int) -> None:
    before = snapshot(data)
    padded, pad_size = pad_dataproto_to_divisor(data, n)
    assert len(padded) % n == 0 and len(padded) == len(data) + pad_size
    assert pad_size < n
    assert_dataproto_equal(unpad_dataproto(padded, pad_size), data)
    assert_dataproto_equal(data, before)


@FAST
@given(dataprotos(max_len=64), st.integers(1, 20))
def test_split_concat_round_trip(data: DataProto, size: int) -> None:
    assume(len(data) > 0)
    parts = data.split(size)
    assert all(len(p) == size for p in parts[:-1]) and 0 < len(parts[-1]) <= size
    assert_dataproto_equal(DataProto.concat(parts), data)


@FAST
@given(dataprotos(min_len=1, max_len=32), st.data())
def test_index_by_int_array_is_gathering_rows(data: DataProto, draw: st.DataObject) -> None:
    n = len(data)
    index = draw.draw(st.lists(st.integers(-n, n - 1), max_size=20))
    picked = data[np.array(index, dtype=np.int64)]
    assert len(picked) == len(index)
    for pos, i in enumerate(index):
        row, expected = picked[pos], data[i]
        if expected.batch is not None:
            for key in expected.batch.keys():
                assert row.batch[key].equal(expected.batch[key]), key
        for key, value in expected.non_tensor_batch.items():
            assert values_equal(row.non_tensor_batch[key], value), key


@FAST
@given(dataprotos(max_len=32, with_non_tensors=True))
def test_select_union_round_trip(data: DataProto) -> None:
    keys = list(data.batch.keys())
    left = data.select(batch_keys=keys[:1], non_tensor_batch_keys=[])
    right = data.select(batch_keys=keys[1:])
    assert_dataproto_equal(left.union(right), data)


@FAST
@given(dataprotos(max_len=32, with_tensors=None, with_non_tensors=None, auto_padding=None))
def test_pickle_round_trip(data: DataProto) -> None:
    bufs: list[pickle.PickleBuffer] = []
    head = pickle.dumps(data, protocol=5, buffer_callback=bufs.append)
    assert_dataproto_equal(pickle.loads(head, buffers=bufs), data)
    assert_dataproto_equal(pickle.loads(pickle.dumps(data)), data)
    assert_dataproto_equal(loads(dumps(data)), data)


@FAST
@given(dataprotos(max_len=32), st.integers(1, 4))
def test_repeat_interleave_every_kth_row(data: DataProto, k: int) -> None:
    repeated = data.repeat(k, interleave=True)
    assert len(repeated) == k * len(data)
    for offset in range(k):
        assert_dataproto_equal(repeated[offset::k], data)
    tiled = data.repeat(k, interleave=False)
    for block in range(k):
        assert_dataproto_equal(tiled[block * len(data) : (block + 1) * len(data)], data)


@FAST
# Arrays inside object columns travel out of band too: leave them out of this byte count.
@given(dataprotos(min_len=1, max_len=48, non_tensor_kinds=("text", "ragged_lists", "mixed_objects", "numeric")), WORLD)
def test_pickled_chunks_carry_only_their_rows(data: DataProto, n: int) -> None:
    assume(len(data) % n == 0)
    row_bytes = sum(t[0:1].numel() * t.element_size() for t in data.batch.values())
    for chunk in data.chunk(n):
        bufs: list[pickle.PickleBuffer] = []
        pickle.dumps(chunk, protocol=5, buffer_callback=bufs.append)
        tensor_bytes = sum(memoryview(b).nbytes for b in bufs) - sum(
            a.nbytes for a in chunk.non_tensor_batch.values() if a.dtype != object
        )
        assert tensor_bytes == row_bytes * len(chunk)
