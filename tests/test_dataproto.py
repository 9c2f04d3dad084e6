"""Examples and error messages for DataProto and TensorBatch."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest
import torch

from dispatchcore import (
    PADDING_ROWS_KEY,
    BatchSizeError,
    DataProto,
    DataProtoConfig,
    DataProtoItem,
    DispatchError,
    TensorBatch,
    chunk_with_padding,
    collate_fn,
    fold_batch_dim,
    pad_dataproto_to_divisor,
    unfold_batch_dim,
    union_two_dict,
    unpad_dataproto,
)
from dispatchcore.testing.assertions import assert_dataproto_equal
from dispatchcore.wire import dumps, loads


def make(n: int = 6, **kw: object) -> DataProto:
    return DataProto.from_dict(
        tensors={"ids": torch.arange(n * 2).reshape(n, 2), "mask": torch.arange(n) % 2 == 0},
        non_tensors={"text": np.array([f"r{i}" for i in range(n)], dtype=object)},
        meta_info={"temperature": 1.0},
        **kw,  # type: ignore[arg-type]
    )


# -- construction -------------------------------------------------------------------


def test_from_dict_mismatched_lengths_names_every_key() -> None:
    with pytest.raises(ValueError, match="columns must share") as info:
        DataProto.from_dict({"a": torch.zeros(3), "b": torch.zeros(4)}, {"c": np.zeros(5)})
    msg = str(info.value)
    assert "tensors['a']: 3" in msg and "tensors['b']: 4" in msg and "non_tensors['c']: 5" in msg
    assert isinstance(info.value, BatchSizeError)


def test_from_dict_converts_lists_and_leaves_inputs_alone() -> None:
    non_tensors = {"s": ["x", "y"]}
    meta = {"k": 1}
    data = DataProto.from_dict({"a": torch.zeros(2)}, non_tensors, meta, auto_padding=True)
    assert data.non_tensor_batch["s"].dtype == object
    assert non_tensors == {"s": ["x", "y"]} and meta == {"k": 1}
    assert data.is_padding_enabled() and data.meta_info[DataProtoConfig.auto_padding_key] is True


def test_from_single_dict_splits_by_type() -> None:
    data = DataProto.from_single_dict({"a": torch.ones(2), "s": np.array(["p", "q"], dtype=object)})
    assert list(data.batch.keys()) == ["a"] and list(data.non_tensor_batch) == ["s"]
    with pytest.raises(TypeError, match="'bad' is a list"):
        DataProto.from_single_dict({"bad": [1, 2]})


def test_len_without_batch_and_only_meta() -> None:
    assert len(DataProto.from_dict(non_tensors={"s": np.array([1, 2, 3])})) == 3
    only_meta = DataProto(meta_info={"x": 1})
    assert len(only_meta) == 0 and only_meta.batch is None
    assert only_meta.chunk(4)[0].meta_info["x"] == 1


def test_constructor_accepts_dict_batch_and_checks_rows() -> None:
    data = DataProto(batch={"a": torch.zeros(3)}, non_tensor_batch={"s": np.zeros(3)})
    assert isinstance(data.batch, TensorBatch) and len(data) == 3
    with pytest.raises(BatchSizeError, match="non_tensor_batch\\['s'\\] has 2 rows"):
        DataProto(batch={"a": torch.zeros(3)}, non_tensor_batch={"s": np.zeros(2)})
    with pytest.raises(TypeError, match="put tensors in the batch"):
        DataProto(non_tensor_batch={"s": torch.zeros(2)})


# -- indexing -----------------------------------------------------------------------


def test_int_index_gives_row_item() -> None:
    data = make()
    item = data[-1]
    assert isinstance(item, DataProtoItem)
    assert item.batch["ids"].tolist() == [10, 11] and item.non_tensor_batch["text"] == "r5"
    assert item.meta_info == {"temperature": 1.0}
    with pytest.raises(IndexError, match="out of range"):
        data[6]


def test_slice_is_a_view() -> None:
    data = make()
    part = data[2:4]
    assert len(part) == 2
    part.batch["ids"][0, 0] = -1
    assert data.batch["ids"][2, 0] == -1
    part.meta_info["new"] = 1
    assert "new" not in data.meta_info


def test_index_arrays_gather_copies() -> None:
    data = make()
    for index in ([0, 2], np.array([0, 2]), torch.tensor([0, 2])):
        out = data[index]
        assert out.batch["ids"][:, 0].tolist() == [0, 4]
        assert out.non_tensor_batch["text"].tolist() == ["r0", "r2"]
    mask = np.array([True, False, True, False, False, False])
    assert data[mask].non_tensor_batch["text"].tolist() == ["r0", "r2"]
    assert data[torch.from_numpy(mask)].batch["ids"][:, 0].tolist() == [0, 4]
    assert len(data[[]]) == 0


@pytest.mark.parametrize("bad", ["ids", 1.5, None, {1}])
def test_bad_index_type_names_the_type(bad: object) -> None:
    with pytest.raises(TypeError, match=type(bad).__name__):
        make()[bad]


def test_bool_scalar_index_is_refused() -> None:
    with pytest.raises(TypeError, match="bool"):
        make()[True]


# -- chunk / split / concat ---------------------------------------------------------


def test_chunk_views_and_round_trip() -> None:
    data = make(6)
    chunks = data.chunk(3)
    assert [len(c) for c in chunks] == [2, 2, 2]
    assert chunks[1].batch["ids"].data_ptr() == data.batch["ids"][2:].data_ptr()
    assert all(PADDING_ROWS_KEY not in c.meta_info for c in chunks)
    assert_dataproto_equal(DataProto.concat(chunks), data)


def test_chunk_not_divisible_says_how_to_enable_padding() -> None:
    with pytest.raises(BatchSizeError) as info:
        make(5).chunk(2)
    msg = str(info.value)
    assert "length 5" in msg and "into 2" in msg
    assert "auto_padding=True" in msg and "pad_dataproto_to_divisor" in msg
    assert isinstance(info.value, ValueError) and isinstance(info.value, DispatchError)


@pytest.mark.parametrize("n", [0, -1])
def test_chunk_needs_positive_count(n: int) -> None:
    with pytest.raises(ValueError, match="positive"):
        make().chunk(n)


def test_chunk_with_auto_padding_does_not_touch_the_caller() -> None:
    data = make(5, auto_padding=True)
    meta_before = dict(data.meta_info)
    chunks = data.chunk(4)
    assert [len(c) for c in chunks] == [2, 2, 2, 2]
    assert [c.meta_info[PADDING_ROWS_KEY] for c in chunks] == [0, 0, 1, 2]
    # Padding repeats rows from the start: rows 5, 6, 7 are rows 0, 1, 2.
    assert chunks[3].non_tensor_batch["text"].tolist() == ["r1", "r2"]
    assert chunks[2].non_tensor_batch["text"].tolist() == ["r4", "r0"]
    assert len(data) == 5 and data.meta_info == meta_before
    # Chunks free of padding rows are still views.
    assert chunks[0].batch["ids"].data_ptr() == data.batch["ids"].data_ptr()
    joined = DataProto.concat(chunks)
    assert PADDING_ROWS_KEY not in joined.meta_info
    assert_dataproto_equal(unpad_dataproto(joined, 3), data)


def test_chunk_with_padding_helper() -> None:
    data = make(5)
    with pytest.raises(BatchSizeError, match="auto_padding=True"):
        chunk_with_padding(data, 2, allow_padding=False)
    chunks, pad = chunk_with_padding(data, 2, allow_padding=True)
    assert pad == 1 and [c.meta_info[PADDING_ROWS_KEY] for c in chunks] == [0, 1]
    chunks, pad = chunk_with_padding(make(4), 2, True)
    assert pad == 0 and [c.meta_info[PADDING_ROWS_KEY] for c in chunks] == [0, 0]


def test_rechunking_a_padded_chunk_keeps_padding_counts() -> None:
    data = make(7, auto_padding=True)
    _first, second = data.chunk(2)
    assert second.meta_info[PADDING_ROWS_KEY] == 1
    micro = second.chunk(2)
    assert [m.meta_info[PADDING_ROWS_KEY] for m in micro] == [0, 1]
    pieces = second.split(3)
    assert [p.meta_info[PADDING_ROWS_KEY] for p in pieces] == [0, 1]


def test_global_padding_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    data = make(3)
    assert not data.is_padding_enabled()
    monkeypatch.setattr(type(DataProtoConfig), "_auto_padding", True)
    assert DataProtoConfig.auto_padding and data.is_padding_enabled()
    assert len(data.chunk(2)) == 2
    monkeypatch.setattr(type(DataProtoConfig), "_auto_padding", False)
    monkeypatch.setenv("VERL_AUTO_PADDING", "1")
    assert data.is_padding_enabled()
    with pytest.raises(TypeError):
        DataProtoConfig.auto_padding = "yes"  # type: ignore[assignment]


def test_split_views() -> None:
    data = make(5)
    parts = data.split(2)
    assert [len(p) for p in parts] == [2, 2, 1]
    assert_dataproto_equal(DataProto.concat(parts), data)
    with pytest.raises(ValueError, match="positive"):
        data.split(0)


def test_concat_empty_list_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="empty list"):
        DataProto.concat([])


def test_concat_merges_metrics_and_refuses_conflicts() -> None:
    a, b = make(2), make(2)
    a.meta_info["metrics"] = {"loss": 1.0}
    b.meta_info["metrics"] = {"loss": 2.0}
    out = DataProto.concat([a, b])
    assert out.meta_info["metrics"] == {"loss": [1.0, 2.0]}
    assert out.meta_info["temperature"] == 1.0
    b.meta_info["temperature"] = 0.5
    with pytest.raises(ValueError, match="'temperature'"):
        DataProto.concat([a, b])


def test_concat_refuses_mismatched_columns() -> None:
    a = make(2)
    b = make(2).select(batch_keys=["ids"])
    with pytest.raises(ValueError, match="different keys"):
        DataProto.concat([a, b])
    with pytest.raises(TypeError, match="item 1 is a int"):
        DataProto.concat([a, 3])  # type: ignore[list-item]


def test_concat_of_non_tensor_only() -> None:
    a = DataProto.from_dict(non_tensors={"s": ["a"]})
    b = DataProto.from_dict(non_tensors={"s": ["b", "c"]})
    assert DataProto.concat([a, b]).non_tensor_batch["s"].tolist() == ["a", "b", "c"]


# -- padding helpers -------------------------------------------------------------------


def test_pad_to_divisor_never_mutates() -> None:
    data = make(5)
    padded, pad = pad_dataproto_to_divisor(data, 4)
    assert pad == 3 and len(padded) == 8 and len(data) == 5
    assert padded.non_tensor_batch["text"].tolist()[5:] == ["r0", "r1", "r2"]
    same, zero = pad_dataproto_to_divisor(data, 5)
    assert zero == 0 and same is not data
    assert_dataproto_equal(unpad_dataproto(padded, pad), data)
    with pytest.raises(ValueError, match="positive"):
        pad_dataproto_to_divisor(data, 0)


def test_padding_method_is_in_place_like_verl() -> None:
    data = make(3)
    data.padding(2)
    assert data.non_tensor_batch["text"].tolist() == ["r0", "r1", "r2", "r2", "r2"]
    data.padding(1, padding_candidate="first")
    assert data.non_tensor_batch["text"].tolist()[-1] == "r0"


# -- column operations -------------------------------------------------------------------


def test_select_pop_rename() -> None:
    data = make()
    sub = data.select(batch_keys=["ids"], non_tensor_batch_keys=[], meta_info_keys=[])
    assert list(sub.batch.keys()) == ["ids"] and sub.non_tensor_batch == {} and sub.meta_info == {}
    assert sub.batch["ids"] is data.batch["ids"]
    deep = data.select(deepcopy=True)
    deep.non_tensor_batch["text"][0] = "changed"
    assert data.non_tensor_batch["text"][0] == "r0"
    popped = data.pop(batch_keys=["mask"], meta_info_keys=["temperature"])
    assert list(popped.batch.keys()) == ["mask"] and popped.meta_info == {"temperature": 1.0}
    assert list(data.batch.keys()) == ["ids"] and data.meta_info == {}
    with pytest.raises(KeyError, match="nope"):
        data.pop(batch_keys=["nope"])
    assert data.rename("ids", "input_ids") is data
    assert list(data.batch.keys()) == ["input_ids"]
    with pytest.raises(ValueError, match="same length"):
        data.rename(["a"], ["b", "c"])


def test_union() -> None:
    left = make().select(batch_keys=["ids"])
    right = make().select(batch_keys=["mask"], meta_info_keys=[])
    right.meta_info["extra"] = 2
    out = left.union(right)
    assert out is left and set(out.batch.keys()) == {"ids", "mask"}
    assert out.meta_info == {"temperature": 1.0, "extra": 2}
    clash = make()
    clash.batch["ids"] = clash.batch["ids"] + 1
    with pytest.raises(ValueError, match="'ids'"):
        make().union(clash)
    with pytest.raises(ValueError, match="'k'"):
        union_two_dict({"k": 1}, {"k": 2})
    with pytest.raises(BatchSizeError):
        make(2).union(make(3))


def test_reorder_repeat_sample_level_repeat() -> None:
    data = make(3)
    data.reorder(torch.tensor([2, 0, 1]))
    assert data.non_tensor_batch["text"].tolist() == ["r2", "r0", "r1"]
    data = make(2)
    assert data.repeat(2).non_tensor_batch["text"].tolist() == ["r0", "r0", "r1", "r1"]
    tiled = data.repeat(2, interleave=False)
    assert tiled.batch["ids"][:, 0].tolist() == [0, 2, 0, 2]
    assert data.sample_level_repeat([1, 3]).non_tensor_batch["text"].tolist() == ["r0"] + ["r1"] * 3
    with pytest.raises(BatchSizeError, match="repeat_times"):
        data.sample_level_repeat([1])


def test_unfold_column_chunks_and_fold() -> None:
    data = DataProto.from_dict({"x": torch.arange(8).reshape(2, 4), "y": torch.tensor([7, 8])})
    out = data.unfold_column_chunks(2, split_keys=["x"])
    assert out.batch["x"].tolist() == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert out.batch["y"].tolist() == [7, 7, 8, 8]
    folded = fold_batch_dim(make(6), 2)
    assert len(folded) == 2 and folded.batch["ids"].shape == (2, 3, 2)
    assert folded.non_tensor_batch["text"].shape == (2, 3)
    assert_dataproto_equal(unfold_batch_dim(folded, 2), make(6))
    with pytest.raises(BatchSizeError):
        fold_batch_dim(make(5), 2)


def test_to_returns_self() -> None:
    data = make()
    assert data.to("cpu") is data and data.batch.device == torch.device("cpu")


def test_make_iterator() -> None:
    data = make(6)
    batches = list(data.make_iterator(mini_batch_size=2, epochs=2, seed=0, dataloader_kwargs={"shuffle": True}))
    assert len(batches) == 6 and all(len(b) == 2 for b in batches)
    assert batches[0].meta_info == data.meta_info
    seen = sorted(t for b in batches[:3] for t in b.non_tensor_batch["text"].tolist())
    assert seen == sorted(data.non_tensor_batch["text"].tolist())
    with pytest.raises(BatchSizeError, match="6 % 4"):
        data.make_iterator(4, 1)


def test_collate_fn_stacks_items() -> None:
    data = make(3)
    out = collate_fn([data[i] for i in range(3)])
    assert out.batch["ids"].tolist() == data.batch["ids"].tolist()
    assert out.non_tensor_batch["text"].tolist() == ["r0", "r1", "r2"]


def test_info_helpers(capsys: pytest.CaptureFixture[str]) -> None:
    data = make()
    data.print_size(prefix="step")
    assert capsys.readouterr().out.startswith("step, Size of tensordict:")
    info = data.get_data_info()
    assert "ids: (6, 2) (torch.int64) cpu" in info and "text: ndarray(6,) (object)" in info
    assert "len=6" in repr(data)


# -- persistence and pickling ------------------------------------------------------------------


def test_save_and_load(tmp_path: object) -> None:
    data = make()
    path = tmp_path / "d.pkl"  # type: ignore[operator]
    data.save_to_disk(path)
    assert_dataproto_equal(DataProto.load_from_disk(path), data)


def test_pickled_chunk_carries_only_its_rows() -> None:
    big = DataProto.from_dict({"x": torch.zeros(1024, 256), "y": torch.ones(1024, dtype=torch.int64)})
    chunk = big.chunk(8)[3]
    bufs: list[pickle.PickleBuffer] = []
    head = pickle.dumps(chunk, protocol=5, buffer_callback=bufs.append)
    own = 128 * 256 * 4 + 128 * 8
    total = len(head) + sum(memoryview(b).nbytes for b in bufs)
    assert sum(memoryview(b).nbytes for b in bufs) == own
    assert total < own + 2048
    back = pickle.loads(head, buffers=bufs)
    assert_dataproto_equal(back, chunk)


@pytest.mark.parametrize("protocol", range(2, pickle.HIGHEST_PROTOCOL + 1))
def test_pickles_under_every_protocol_and_copies(protocol: int) -> None:
    data = make(5)
    data.batch["flag"] = torch.tensor([True, False, True, True, False])
    back = pickle.loads(pickle.dumps(data.chunk(5)[2], protocol=protocol))
    assert_dataproto_equal(back, data.chunk(5)[2])
    deep = copy.deepcopy(data)
    deep.batch["ids"].add_(100)
    assert_dataproto_equal(copy.copy(data), data)
    assert data.batch["ids"].max() < 100


def test_protocol5_stream_names_no_numpy() -> None:
    """Under protocol 5 tensors go as bare buffers: the stream stays short (it is paid per rank per call)."""
    data = DataProto.from_dict({"a": torch.arange(8), "b": torch.zeros(8, 2)}, meta_info={"k": 1})
    bufs: list[pickle.PickleBuffer] = []
    head = pickle.dumps(data, protocol=5, buffer_callback=bufs.append)
    assert b"numpy" not in head and len(bufs) == 2
    assert_dataproto_equal(pickle.loads(head, buffers=bufs), data)
    readonly = pickle.loads(head, buffers=[bytes(b.raw()) for b in bufs])  # as shared memory arrives
    assert_dataproto_equal(readonly, data)


def test_serialization_round_trip() -> None:
    data = make(5, auto_padding=True)
    data.meta_info["metrics"] = {"a": [1, 2]}
    data.batch["bf"] = torch.randn(5, 3).to(torch.bfloat16)
    payload = dumps(data.chunk(2)[1])
    assert payload.buffers, "tensors must travel out of band"
    back = loads(payload)
    assert_dataproto_equal(back, data.chunk(2)[1])
    back.batch["ids"].add_(100)
    assert data.batch["ids"].max() < 100


# -- TensorBatch ----------------------------------------------------------------------------


def test_tensor_batch_mapping_api() -> None:
    tb = TensorBatch({"a": torch.zeros(4, 2), "b": torch.arange(4)}, batch_size=[4])
    assert len(tb) == 4 and tb.batch_size == torch.Size([4]) and list(tb) == ["a", "b"]
    assert "a" in tb and tb.keys() == {"a", "b"}
    tb["c"] = torch.ones(4)
    with pytest.raises(BatchSizeError, match="'d' has shape \\(3,\\)"):
        tb["d"] = torch.ones(3)
    assert tb.pop("c").shape == (4,) and "c" not in tb
    assert tb.update({"e": torch.zeros(4)}) is tb
    assert list(tb.select("a").keys()) == ["a"] and "a" not in tb.exclude("a")
    with pytest.raises(KeyError, match="'zz' not in TensorBatch"):
        tb["zz"]
    rows = tb[1:3]
    assert rows.batch_size == torch.Size([2]) and rows["a"].data_ptr() == tb["a"][1:].data_ptr()
    assert tb[torch.tensor([0, 3])]["b"].tolist() == [0, 3]
    assert tb[0].batch_size == torch.Size([])
    assert torch.cat([tb, tb]).batch_size == torch.Size([8])
    assert torch.stack([tb, tb]).batch_size == torch.Size([2, 4])
    assert tb.to("cpu").device == torch.device("cpu")
    assert tb.clone()["a"].data_ptr() != tb["a"].data_ptr()
    with pytest.raises(TypeError, match="float"):
        tb[1.0]


def test_tensor_batch_pickles_out_of_band() -> None:
    tb = TensorBatch({"a": torch.arange(100)})[10:20]
    bufs: list[pickle.PickleBuffer] = []
    head = pickle.dumps(tb, protocol=5, buffer_callback=bufs.append)
    assert sum(memoryview(b).nbytes for b in bufs) == 80
    assert pickle.loads(head, buffers=bufs)["a"].tolist() == list(range(10, 20))


class _FakeTensorDict:
    """Quacks like tensordict.TensorDict (recognised by its module name)."""

    __module__ = "tensordict._td"

    def __init__(self, source: dict[str, torch.Tensor], batch_size: list[int]) -> None:
        self._source, self.batch_size = source, torch.Size(batch_size)

    def items(self) -> object:
        return self._source.items()


def test_tensordict_input_is_converted() -> None:
    td = _FakeTensorDict({"a": torch.arange(3)}, [3])
    data = DataProto(batch=td)
    assert isinstance(data.batch, TensorBatch) and data.batch["a"].tolist() == [0, 1, 2]
    data.batch = _FakeTensorDict({"b": torch.zeros(3)}, [3])
    assert list(data.batch.keys()) == ["b"]
    assert TensorBatch(td).batch_size == torch.Size([3])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_batches_round_trip() -> None:
    data = make(5, auto_padding=True).to("cuda")
    data.batch["empty"] = torch.zeros(5, 0, device="cuda")
    chunks = data.chunk(2)
    assert all(c.batch.device.type == "cuda" for c in chunks)
    back = loads(dumps(chunks[1]))
    assert back.batch.device.type == "cuda"
    assert_dataproto_equal(back, chunks[1])
    assert_dataproto_equal(unpad_dataproto(DataProto.concat(chunks), 1), data)
