"""Lazy DataProto results behave exactly like eager ones, under any chain of row and column operations.

Hypothesis draws a batch (any length, dtypes, object columns), the producing
and consuming world sizes, and a chain of operations (slices, gathers with
repeats, reorders, padding, chunks, concatenation and union with driver-side
parts, column selection).  The lazy result must give the same rows as the
eager one: read on the driver, and when passed into another call.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dispatchcore import DataProto, Dispatch, LazyDataProto, Worker, WorkerGroup, register
from dispatchcore.testing import assert_dataproto_equal
from dispatchcore.testing.strategies import dataprotos


class Identity(Worker):
    @register(Dispatch.DP_COMPUTE_PROTO)
    def same(self, data: DataProto) -> DataProto:
        data.meta_info.pop("_padding_rows", None)
        return data


@pytest.fixture(scope="module")
def groups() -> Iterator[dict[int, WorkerGroup[Identity]]]:
    made = {n: WorkerGroup(Identity, n, backend="local") for n in (1, 2, 3)}
    yield made
    for wg in made.values():
        wg.shutdown()


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("slice"), st.floats(0, 1), st.floats(0, 1)),
        st.tuples(st.just("take"), st.integers(0, 2**16)),
        st.tuples(st.just("reorder"), st.integers(0, 2**16)),
        st.tuples(st.just("pad"), st.integers(0, 3)),
        st.tuples(st.just("chunk"), st.integers(1, 3), st.integers(0, 2)),
        st.tuples(st.just("concat_local")),
        st.tuples(st.just("union_column"), st.integers(0, 2**16)),
        st.tuples(st.just("select_first")),
    ),
    max_size=4,
)


def apply(op: tuple[Any, ...], data: DataProto, reference: DataProto) -> DataProto:
    """``op`` on ``data``; ``reference`` is the eager twin (driver-side parts are taken from it)."""
    kind, n = op[0], len(reference)
    if kind == "slice":
        lo, hi = sorted((int(op[1] * n), int(op[2] * n)))
        return data[lo:hi]
    if kind == "take":
        index = np.random.default_rng(op[1]).integers(0, max(n, 1), size=n) if n else np.zeros(0, dtype=np.int64)
        return data.select_idxs(index)
    if kind == "reorder":
        data.reorder(torch.from_numpy(np.random.default_rng(op[1]).permutation(n)))
        return data
    if kind == "pad":
        if n:
            data.padding(op[1])
        return data
    if kind == "chunk":
        if n == 0:
            return data
        chunks = data.chunk(op[1]) if n % op[1] == 0 else [data]
        return chunks[min(op[2], len(chunks) - 1)]
    if kind == "concat_local":
        return DataProto.concat([data, reference])
    if kind == "union_column":
        column = torch.from_numpy(np.random.default_rng(op[1]).standard_normal(n).astype(np.float32))
        return data.union(DataProto.from_dict({f"u{op[2]}": column}))
    if kind == "select_first":
        keys = sorted(reference.batch.keys()) if reference.batch is not None else []
        return data.select(keys[:1]) if keys else data
    raise AssertionError(kind)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    data=dataprotos(1, 24, with_meta=False, auto_padding=True),
    producers=st.integers(1, 3),
    consumers=st.integers(1, 3),
    ops=OPS,
)
def test_lazy_matches_eager_under_any_chain(
    groups: dict[int, WorkerGroup[Identity]], data: DataProto, producers: int, consumers: int, ops: list[Any]
) -> None:
    eager = groups[producers].same(data)
    lazy = groups[producers].same.options(lazy=True)(data)
    assert isinstance(lazy, LazyDataProto)
    assert_dataproto_equal(lazy, eager)
    for step, op in enumerate(ops):
        op = (*op, step) if op[0] == "union_column" else op  # a fresh column name per step
        reference = eager.select(deepcopy=True) if op[0] in ("concat_local",) else eager
        lazy, eager = apply(op, lazy, reference), apply(op, eager, reference)
        assert len(lazy) == len(eager)
    assert_dataproto_equal(lazy.materialize(), eager)
    if len(eager):
        assert_dataproto_equal(groups[consumers].same(lazy), groups[consumers].same(eager))
