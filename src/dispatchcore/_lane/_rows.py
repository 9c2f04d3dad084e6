"""A large DataProto result received straight into the rows of the collect's output, not copied there again.

The first rank's answer sets the plan; a tensor that does not fit it is received and copied as before.
"""

from __future__ import annotations

import pickle
import threading
from typing import Any

import numpy as np
import torch

from .._data import DataProto
from .._trace import TimedResult
from .._wire import RowBuffers

#: One batch tensor of a result: (frame part index, key, dtype, shape).
Slot = tuple[int, str, torch.dtype, tuple[int, ...]]
#: (dtype, trailing shape, rows per position, output buffer) of one key.
_KeyPlan = tuple[torch.dtype, tuple[int, ...], int, torch.Tensor]


def _data(value: Any) -> Any:
    """The rank's own value (a traced call wraps it in a ``TimedResult``)."""
    return value.value if type(value) is TimedResult else value


def row_layout(value: Any, buffers: list[Any], first: int) -> bytes:
    """The frame note of a rank's answer: which parts (``first`` + index in ``buffers``) hold which batch tensor."""
    value = _data(value)
    if not isinstance(value, DataProto) or value.batch is None or not buffers:
        return b""
    where: dict[tuple[int, int], int] = {}
    for i, buffer in enumerate(buffers):
        array = np.frombuffer(buffer, dtype=np.uint8)
        if array.nbytes:
            where[(array.ctypes.data, array.nbytes)] = first + i
    slots: list[Slot] = []
    for key, t in value.batch.items():
        if t.device.type != "cpu" or t.numel() == 0 or t.dim() == 0 or not t.is_contiguous():
            continue
        index = where.get((int(t.data_ptr()), t.numel() * t.element_size()))
        if index is not None:
            slots.append((index, key, t.dtype, tuple(t.shape)))
    return pickle.dumps(tuple(slots)) if slots else b""


class RowPlan:
    """Row placement of one call's DataProto results (one per call handle)."""

    def __init__(self, positions: int, buffers: RowBuffers) -> None:
        self._positions = positions
        self._buffers = buffers
        self._lock = threading.Lock()
        self._keys: dict[str, _KeyPlan] | None = None
        #: The output views each position's tensors were received into, for :meth:`adopt`.
        self._views: dict[int, dict[str, torch.Tensor]] = {}

    def targets(self, position: int, note: bytes, sizes: list[int]) -> dict[int, memoryview] | None:
        """Where the link receives parts of ``position``'s answer (part index -> memory); ``None``: nowhere."""
        layout: tuple[Slot, ...] = pickle.loads(note)  # noqa: S301 - a rank that proved the lane's token
        with self._lock:
            if self._keys is None:
                allocate = self._buffers.allocate
                self._keys = {
                    key: (dtype, shape[1:], shape[0], allocate((shape[0] * self._positions, *shape[1:]), dtype))
                    for _, key, dtype, shape in layout
                }
            keys = self._keys
        targets: dict[int, memoryview] = {}
        views: dict[str, torch.Tensor] = {}
        for index, key, dtype, shape in layout:
            plan = keys.get(key)
            if plan is None or index >= len(sizes):
                continue
            want_dtype, trailing, rows, out = plan
            if dtype != want_dtype or tuple(shape[1:]) != trailing or shape[0] != rows:
                continue
            view = out[position * rows : (position + 1) * rows]
            target = view.reshape(-1).view(torch.uint8).numpy().data
            if target.nbytes != sizes[index]:
                continue
            targets[index] = target
            views[key] = view
        if not targets:
            return None
        with self._lock:
            self._views[position] = views
        return targets

    def adopt(self, position: int, value: Any) -> None:
        """Swap the tensors unpickled over ``position``'s rows for the buffer's own views (so they join uncopied)."""
        with self._lock:
            views = self._views.pop(position, None)
        value = _data(value)
        if not views or not isinstance(value, DataProto) or value.batch is None:
            return
        for key, view in views.items():
            if key in value.batch.keys():
                t = value.batch[key]
                if t.data_ptr() == view.data_ptr() and t.dtype == view.dtype and t.shape == view.shape:
                    value.batch[key] = view
