"""Weight transfers between local groups: every rank lives in this process, so a bucket is its views."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from typing import Any

import torch

#: What ``receive`` returns: wait for the bucket, get ``(tensors, shared)`` (``TensorLink``).
Arrival = Callable[[], tuple[list[torch.Tensor], bool]]


class LocalTensorLink:
    """The :class:`~dispatchcore.executor.TensorLink` of every local group in this process."""

    same_process = True

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._held: dict[int, list[Any]] = {}

    def publish(self, tensors: list[torch.Tensor], readers: int) -> int:
        """A key to ``tensors`` for ``readers`` destination ranks (an int: isolation passes it as is)."""
        with self._lock:
            key = next(self._ids)
            self._held[key] = [tensors, readers]
        return key

    def receive(self, token: Any, into: list[torch.Tensor | None]) -> Arrival:
        """Copy the views published under ``token`` into ``into`` (casting); the rest stay shared views."""
        with self._lock:
            entry = self._held[token]
            entry[1] -= 1
            if entry[1] <= 0:
                del self._held[token]
        got, targets, sources = [], [], []
        for x, target in zip(entry[0], into, strict=True):
            if target is not None:
                targets.append(target)
                sources.append(x if x.shape == target.shape else x.reshape(target.shape))
            got.append(x if target is None else target)
        if targets:  # one call for the bucket: no GIL taken back between its pieces
            torch._foreach_copy_(targets, sources)
        return lambda: (got, True)


LINK = LocalTensorLink()
