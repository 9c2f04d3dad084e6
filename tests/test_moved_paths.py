"""Unit test of an internal part (the moved-path aliases, dispatchcore._base._moved): old pickles and imports load.

The core's modules moved into concept packages; pickles and imports written before keep working.
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
    assert importlib.import_module("dispatchcore._errors").WorkerError is dispatchcore.WorkerError


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
