"""A tensor as exactly its bytes for pickle protocol 5, rebuilt over any buffer without a copy.

Imports nothing of dispatchcore, so ``TensorBatch`` and ``DataProto`` reduce with it too.
"""

from __future__ import annotations

import pickle
import warnings
from typing import Any

import numpy as np
import torch


def tensor_array(t: torch.Tensor) -> np.ndarray:
    """A flat uint8 numpy view of ``t``'s own elements (copying only if needed); pickles under any protocol."""
    t = t.detach().cpu()
    if t.numel() == 0:
        return np.empty(0, dtype=np.uint8)
    if not t.is_contiguous():
        t = t.contiguous()
    if t.dtype == torch.bool:
        t = t.view(torch.uint8)
    return t.reshape(-1).view(torch.uint8).numpy()


def rebuild_tensor(
    raw: Any,
    dtype: torch.dtype,
    shape: tuple[int, ...],
    device: str | None = None,
    requires_grad: bool = False,
) -> torch.Tensor:
    """Inverse of :func:`reduce_tensor`: a tensor over ``raw``'s memory (any buffer; numpy in older pickles)."""
    view = memoryview(raw)
    if view.nbytes == 0:
        t = torch.empty(shape, dtype=dtype)
    elif view.readonly:
        # Read-only shared memory (Ray's object store) or bytes: torch only warns.  Executors that keep
        # isolation copy before this point; here the memory is wrapped as is.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            t = torch.frombuffer(raw, dtype=torch.uint8).view(dtype).reshape(shape)
    else:
        t = torch.frombuffer(raw, dtype=torch.uint8).view(dtype).reshape(shape)
    if device is not None and device != "cpu":
        on_cuda = device.startswith("cuda") and torch.cuda.is_available()  # lands on this rank's current device
        t = t.to(torch.device("cuda", torch.cuda.current_device()) if on_cuda else torch.device(device))
    if requires_grad:
        t.requires_grad_(True)
    return t


def reduce_tensor(t: torch.Tensor, *, protocol5: bool = True) -> tuple[Any, tuple[Any, ...]]:
    """``__reduce__`` value of a tensor as its own bytes, never its storage (``protocol5``: a bare pickle buffer)."""
    device = None if t.device.type == "cpu" else str(t.device)
    raw = tensor_array(t)  # protocol 5: a bare buffer, out of band and no numpy in the stream
    return rebuild_tensor, (
        pickle.PickleBuffer(raw) if protocol5 else raw,  # type: ignore[arg-type]  # numpy arrays export the buffer protocol
        t.dtype,
        tuple(t.shape),
        device,
        bool(t.requires_grad and t.is_leaf),
    )
