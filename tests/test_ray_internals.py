"""Unit test of internal parts (the object store packer, runtime helpers): imports executors_ray._store and _runtime.

Moved out of ``test_ray_executor.py``, which tests the ray backend through public names only.
"""

from __future__ import annotations

import pytest
import torch

ray = pytest.importorskip("ray")

from dispatchcore import DataProto  # noqa: E402
from executors_ray._runtime import cuda_device_index, ip_sort_key  # noqa: E402
from executors_ray.testing import ray_session  # noqa: E402, F401

pytestmark = [pytest.mark.usefixtures("ray_session"), pytest.mark.timeout(120)]


def test_pack_falls_back_to_cloudpickle_for_code_by_value():
    from dispatchcore.wire import dumps
    from executors_ray._store import pack_value, unpack

    data = DataProto.from_dict({"x": torch.arange(6).reshape(3, 2)}, meta_info={"f": len})
    fast = pack_value(data)
    assert torch.equal(unpack(fast, copy=True).batch["x"], data.batch["x"])
    assert unpack(pack_value(lambda v: v + 1), copy=True)(1) == 2  # C pickler refuses: cloudpickle
    by_reference = dumps(_ByValue(), share_callables=True).data  # the C pickler's stream names the class
    by_value = pack_value(_ByValue())[0]  # a test module no rank can import: dispatchcore.wire sends it by value
    assert by_value == dumps(_ByValue()).data != by_reference  # this module's code travels by value


class _ByValue:
    """An instance whose class must travel by value (its module is a test module)."""


def test_helpers():
    assert sorted(["10.0.0.10", "10.0.0.9", "9.1.1.1"], key=ip_sort_key) == ["9.1.1.1", "10.0.0.9", "10.0.0.10"]
    assert cuda_device_index([], None) is None
    assert cuda_device_index(["3"], "2,3") == 1
    assert cuda_device_index(["3"], None) == 3
