"""Concatenation joins rows an executor received into one buffer without copying, and nothing else."""

from __future__ import annotations

import gc

import torch

from dispatchcore import DataProto
from dispatchcore._row_concat import _JOINABLE, joinable_rows
from dispatchcore._row_concat import cat_rows as _cat_rows


def filled(rows: int, cols: int = 3, dtype: torch.dtype = torch.int64) -> torch.Tensor:
    out = joinable_rows((rows, cols), dtype)
    out.copy_(torch.arange(rows * cols).reshape(rows, cols).to(dtype))
    return out


def test_adjacent_views_of_a_joinable_buffer_are_joined_without_a_copy() -> None:
    out = filled(6)
    joined = _cat_rows([out[0:2], out[2:4], out[4:6]])
    assert joined.data_ptr() == out.data_ptr() and joined.is_contiguous()
    assert torch.equal(joined, torch.arange(18).reshape(6, 3))


def test_the_join_is_granted_once() -> None:
    out = filled(4)
    parts = [out[0:2], out[2:4]]
    first = _cat_rows(parts)
    second = _cat_rows(parts)
    assert first.data_ptr() == out.data_ptr()
    assert second.data_ptr() != out.data_ptr() and torch.equal(second, out)


def test_a_subset_of_adjacent_rows_is_joined_as_a_view_of_those_rows() -> None:
    out = filled(6)
    joined = _cat_rows([out[2:4], out[4:6]])
    assert joined.data_ptr() == out[2].data_ptr() and torch.equal(joined, out[2:6])


def test_gaps_reordering_and_mixed_storages_are_copied() -> None:
    for parts in (
        lambda o: [o[0:2], o[4:6]],  # a gap
        lambda o: [o[2:4], o[0:2]],  # out of order
        lambda o: [o[0:2], o[2:4].clone()],  # another storage
    ):
        out = filled(6)
        pieces = parts(out)
        joined = _cat_rows(pieces)
        assert joined.data_ptr() != out.data_ptr()
        assert torch.equal(joined, torch.cat([p.clone() for p in pieces]))


def test_ordinary_tensors_are_always_copied() -> None:
    base = torch.arange(12).reshape(4, 3)
    joined = _cat_rows([base[0:2], base[2:4]])
    assert joined.data_ptr() != base.data_ptr() and torch.equal(joined, base)
    single = _cat_rows([base])
    assert single.data_ptr() != base.data_ptr()


def test_dataproto_concat_of_ordinary_chunks_still_returns_new_memory() -> None:
    data = DataProto.from_dict({"x": torch.arange(8).reshape(4, 2)})
    joined = DataProto.concat(data.chunk(2))
    joined.batch["x"] += 1
    assert data.batch["x"].tolist() == [[0, 1], [2, 3], [4, 5], [6, 7]]


def test_dataproto_concat_of_joinable_rows_is_one_view() -> None:
    out = filled(4, dtype=torch.float32)
    parts = [DataProto.from_dict({"x": out[0:2]}), DataProto.from_dict({"x": out[2:4]})]
    joined = DataProto.concat(parts)
    assert joined.batch["x"].data_ptr() == out.data_ptr()
    assert torch.equal(joined.batch["x"], out)


def test_bool_and_multi_dim_rows() -> None:
    out = joinable_rows((4, 2, 2), torch.bool)
    out.copy_(torch.arange(16).reshape(4, 2, 2) % 3 == 0)
    joined = _cat_rows([out[0:1], out[1:4]])
    assert joined.data_ptr() == out.data_ptr() and joined.shape == (4, 2, 2) and torch.equal(joined, out)


def test_buffers_are_forgotten_when_freed() -> None:
    out = filled(2)
    ptr = out.untyped_storage().data_ptr()
    assert ptr in _JOINABLE
    del out
    gc.collect()
    assert ptr not in _JOINABLE


def test_empty_buffer() -> None:
    out = joinable_rows((0, 3), torch.int64)
    assert out.shape == (0, 3)
    assert _cat_rows([out[0:0], out[0:0]]).shape == (0, 3)
