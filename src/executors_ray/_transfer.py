"""Weight transfers between Ray groups: one object per bucket, put by the source rank, or a small bucket inline.

See docs/weight-sync.md.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch

from dispatchcore.executor import TensorSourceLost

#: Buckets up to this many bytes ride the control lane through the driver, in the steps' own messages: for
#: them the object store's put, hand-over and read cost more than the bytes (measured: a 0.34 MB set 17 -> 8 ms).
INLINE_BYTES = 1 << 20


class _Inline(list[Any]):
    """A bucket's arrays carried as the token itself."""


class RayTensorLink:
    """The :class:`~dispatchcore.executor.TensorLink` of a Ray rank actor."""

    same_process = False

    def __init__(self, death_timeout: float) -> None:
        #: The object is in the store before any destination asks: a read waits only on transport.
        self._timeout = death_timeout

    def publish(self, tensors: list[torch.Tensor], readers: int) -> Any:
        arrays = [t.reshape(-1).view(torch.uint8).numpy() for t in tensors]
        if sum(a.nbytes for a in arrays) <= INLINE_BYTES:
            return _Inline(arrays)
        import ray

        return ray.put(arrays)

    def receive(self, token: Any, into: list[torch.Tensor | None]) -> Callable[[], tuple[list[torch.Tensor], bool]]:
        """``ray.get`` the bucket and copy each piece into its place in ``into`` (the rest: store memory)."""
        import ray

        try:
            arrays = token if isinstance(token, _Inline) else ray.get(token, timeout=self._timeout)
        except Exception as exc:  # noqa: BLE001 - owner died, object lost, or a read past the bound
            raise TensorSourceLost(f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}") from exc
        got = []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # read-only store memory: only read here, or handed on as shared
            for a, target in zip(arrays, into, strict=True):
                x = torch.from_numpy(a)
                if target is not None:
                    target.reshape(-1).view(torch.uint8).copy_(x)
                got.append(x if target is None else target)
        return lambda: (got, True)
