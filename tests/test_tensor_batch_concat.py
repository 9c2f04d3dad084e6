"""Concatenation adopts rows an executor received into its call's RowBuffers, and nothing else."""

from __future__ import annotations

import torch

from dispatchcore import DataProto
from dispatchcore.wire import RowBuffers, adopting, cat_rows

BUFFERS = RowBuffers()


def collecting(buffers: RowBuffers | None = BUFFERS) -> object:
    """The collect step of a call whose executor received into ``buffers``."""
    return adopting(buffers)


def filled(rows: int, cols: int = 3, dtype: torch.dtype = torch.int64, buffers: RowBuffers = BUFFERS) -> torch.Tensor:
    out = buffers.allocate((rows, cols), dtype)
    out.copy_(torch.arange(rows * cols).reshape(rows, cols).to(dtype))
    return out


def test_adjacent_views_of_a_row_buffer_are_joined_without_a_copy() -> None:
    out = filled(6)
    with collecting():
        joined = cat_rows([out[0:2], out[2:4], out[4:6]])
    assert joined.data_ptr() == out.data_ptr() and joined.is_contiguous()
    assert torch.equal(joined, torch.arange(18).reshape(6, 3))


def test_the_join_is_granted_once() -> None:
    out = filled(4)
    parts = [out[0:2], out[2:4]]
    with collecting():
        first = cat_rows(parts)
        second = cat_rows(parts)
    assert first.data_ptr() == out.data_ptr()
    assert second.data_ptr() != out.data_ptr() and torch.equal(second, out)


def test_a_subset_of_adjacent_rows_is_joined_as_a_view_of_those_rows() -> None:
    out = filled(6)
    with collecting():
        joined = cat_rows([out[2:4], out[4:6]])
    assert joined.data_ptr() == out[2].data_ptr() and torch.equal(joined, out[2:6])


def test_gaps_reordering_and_mixed_storages_are_copied() -> None:
    for parts in (
        lambda o: [o[0:2], o[4:6]],  # a gap
        lambda o: [o[2:4], o[0:2]],  # out of order
        lambda o: [o[0:2], o[2:4].clone()],  # another storage
    ):
        out = filled(6)
        pieces = parts(out)
        with collecting():
            joined = cat_rows(pieces)
        assert joined.data_ptr() != out.data_ptr()
        assert torch.equal(joined, torch.cat([p.clone() for p in pieces]))


def test_only_the_current_calls_buffers_are_adopted() -> None:
    other = RowBuffers()
    out = filled(4, buffers=other)
    with collecting():  # a call whose executor received elsewhere
        assert cat_rows([out[0:2], out[2:4]]).data_ptr() != out.data_ptr()
    out = filled(4)
    assert cat_rows([out[0:2], out[2:4]]).data_ptr() != out.data_ptr(), "outside a collect nothing is adopted"
    with collecting(None):
        assert cat_rows([out[0:2], out[2:4]]).data_ptr() != out.data_ptr()


def test_ordinary_tensors_are_always_copied() -> None:
    base = torch.arange(12).reshape(4, 3)
    with collecting():
        joined = cat_rows([base[0:2], base[2:4]])
        single = cat_rows([base])
    assert joined.data_ptr() != base.data_ptr() and torch.equal(joined, base)
    assert single.data_ptr() != base.data_ptr()


def test_dataproto_concat_of_ordinary_chunks_still_returns_new_memory() -> None:
    data = DataProto.from_dict({"x": torch.arange(8).reshape(4, 2)})
    joined = DataProto.concat(data.chunk(2))
    joined.batch["x"] += 1
    assert data.batch["x"].tolist() == [[0, 1], [2, 3], [4, 5], [6, 7]]


def test_dataproto_concat_of_received_rows_is_one_view() -> None:
    out = filled(4, dtype=torch.float32)
    parts = [DataProto.from_dict({"x": out[0:2]}), DataProto.from_dict({"x": out[2:4]})]
    with collecting():
        joined = DataProto.concat(parts)
    assert joined.batch["x"].data_ptr() == out.data_ptr()
    assert torch.equal(joined.batch["x"], out)


def test_bool_and_multi_dim_rows() -> None:
    out = BUFFERS.allocate((4, 2, 2), torch.bool)
    out.copy_(torch.arange(16).reshape(4, 2, 2) % 3 == 0)
    with collecting():
        joined = cat_rows([out[0:1], out[1:4]])
    assert joined.data_ptr() == out.data_ptr() and joined.shape == (4, 2, 2) and torch.equal(joined, out)


def test_empty_buffer() -> None:
    out = BUFFERS.allocate((0, 3), torch.int64)
    assert out.shape == (0, 3)
    with collecting():
        assert cat_rows([out[0:0], out[0:0]]).shape == (0, 3)
