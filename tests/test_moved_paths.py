"""Unit test of an internal part (the moved-path aliases, dispatchcore._base._moved): old pickles load.

The core's modules moved into concept packages; pickles written before name the old paths of the
data classes and keep loading.  Other old private paths are gone.
"""

from __future__ import annotations

import importlib
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

import dispatchcore
from dispatchcore import DataProto
from dispatchcore._base._moved import MOVED

#: Written by ``DataProto.save_to_disk`` of dispatchcore before the move (it names ``dispatchcore._dataproto``).
OLD_PICKLE = Path(__file__).parent / "data" / "dataproto_before_packages.pkl"


def test_a_dataproto_saved_before_the_move_loads() -> None:
    assert b"dispatchcore._dataproto" in OLD_PICKLE.read_bytes()
    data = DataProto.load_from_disk(str(OLD_PICKLE))
    assert isinstance(data, DataProto)
    assert torch.equal(data.batch["x"], torch.arange(6).reshape(3, 2))
    assert torch.equal(data.batch["y"], torch.tensor([0.5, 1.5, 2.5]))
    assert data.non_tensor_batch["s"].tolist() == ["a", "b", "c"]
    assert data.meta_info == {"step": 7}
    with OLD_PICKLE.open("rb") as f:
        assert isinstance(pickle.load(f), DataProto)


def test_old_module_paths_import_as_the_modules_that_hold_their_names() -> None:
    old = importlib.import_module("dispatchcore._dataproto")
    assert old.DataProto is dispatchcore.DataProto
    assert importlib.import_module("dispatchcore._tensor_batch").TensorBatch is dispatchcore.TensorBatch
    assert importlib.import_module("dispatchcore._trace").Tracer is dispatchcore.Tracer
    assert importlib.import_module("dispatchcore._worker").Worker is dispatchcore.Worker


def test_the_aliases_are_only_the_paths_old_pickles_name() -> None:
    assert len(MOVED) <= 5
    assert set(MOVED) == {"dispatchcore._dataproto", "dispatchcore._tensor_batch"}
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("dispatchcore._errors")  # a private path no pickle names: not kept


def test_a_tensor_batch_pickled_under_its_old_path_loads() -> None:
    batch = dispatchcore.TensorBatch({"x": torch.arange(6).reshape(3, 2)}, batch_size=[3])
    blob = pickle.dumps(batch, protocol=0)  # protocol 0 names classes as text lines
    assert b"dispatchcore._data._tensor_batch" in blob
    old = blob.replace(b"dispatchcore._data._tensor_batch", b"dispatchcore._tensor_batch")
    back = pickle.loads(old)
    assert isinstance(back, dispatchcore.TensorBatch)
    assert torch.equal(back["x"], batch["x"])


@pytest.mark.parametrize("old", sorted(MOVED))
def test_every_moved_path_imports(old: str) -> None:
    module = importlib.import_module(old)
    assert module.__name__ != old  # the module itself, under its new name


def test_new_pickles_name_the_new_paths_and_round_trip() -> None:
    data = DataProto.from_dict({"x": torch.arange(4)}, {"s": np.arange(4)})
    blob = pickle.dumps(data)
    assert b"dispatchcore._dataproto" not in blob
    back = pickle.loads(blob)
    assert torch.equal(back.batch["x"], data.batch["x"])
