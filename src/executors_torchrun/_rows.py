"""One output buffer per tensor key for a call whose results are concatenated.

When the collect step concatenates every rank's ``DataProto`` (the core sets
``Call.results_are_copied``), receiving each rank's rows into fresh memory
and then copying them into the result costs a fresh allocation plus a copy
per byte.  Instead the hub receives each rank's tensor straight into its
rows of one buffer per key, allocated from the call handle's
:class:`~dispatchcore.wire.RowBuffers`, and the concatenation (which gets
those buffers with the results) returns a view spanning them.

Row counts are not known before results arrive, so the first rank's answer
sets the plan: every position is assumed to return as many rows as it did.
A rank whose tensor does not fit (other rows, dtype or trailing shape, or a
key the first did not have) is received into fresh memory and the collect
step copies as before; nothing is ever wrong, only slower.
"""

from __future__ import annotations

import threading
from typing import Any

import torch

from dispatchcore.wire import RowBuffers

#: (dtype, trailing shape, rows per position, output buffer) of one key.
_KeyPlan = tuple[torch.dtype, tuple[int, ...], int, torch.Tensor]


class RowPlan:
    """Row placement of one call's DataProto results (one per call handle)."""

    def __init__(self, positions: int, buffers: RowBuffers) -> None:
        self._positions = positions
        self._buffers = buffers
        self._lock = threading.Lock()
        self._keys: dict[str, _KeyPlan] | None = None

    def targets(self, position: int, layout: Any) -> tuple[dict[int, torch.Tensor], dict[str, torch.Tensor]]:
        """Receive targets by buffer index and the views they become, for one rank's result."""
        with self._lock:
            if self._keys is None:
                self._keys = {
                    key: (
                        dtype,
                        shape[1:],
                        shape[0],
                        self._buffers.allocate((shape[0] * self._positions, *shape[1:]), dtype),
                    )
                    for _, key, dtype, shape in layout
                }
            keys = self._keys
        targets: dict[int, torch.Tensor] = {}
        views: dict[str, torch.Tensor] = {}
        for index, key, dtype, shape in layout:
            plan = keys.get(key)
            if plan is None:
                continue
            want_dtype, trailing, rows, out = plan
            if dtype != want_dtype or tuple(shape[1:]) != trailing or shape[0] != rows:
                continue
            view = out[position * rows : (position + 1) * rows]
            targets[index] = view.reshape(-1).view(torch.uint8)
            views[key] = view
        return targets, views
