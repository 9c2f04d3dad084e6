"""Concatenating rows with as few copies and page faults as possible.

The collect step of every DataProto-returning call ends in one
concatenation per tensor key.  Two things make it cheaper than a plain
``torch.cat``: large outputs are allocated by numpy (huge pages, fewer page
faults), and rows an executor already received into one
:func:`joinable_rows` buffer, in order, are joined as a view, not copied.
"""

from __future__ import annotations

import threading
import weakref

import numpy as np
import torch

__all__ = ["cat_rows", "joinable_rows"]

#: Outputs at least this large are allocated through numpy (see :func:`cat_rows`).
_NUMPY_ALLOC_BYTES = 1 << 20


#: Storages (by data pointer) whose adjacent row views one ``cat`` may join
#: without copying; see :func:`joinable_rows`.
_JOINABLE: dict[int, weakref.ref[np.ndarray]] = {}
_JOINABLE_LOCK = threading.Lock()


def joinable_rows(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A fresh numpy-allocated tensor whose row slices one ``cat`` may join without a copy.

    Executors receive each rank's rows straight into slices of such a buffer;
    the collect step's concatenation then returns a view spanning the slices
    instead of copying them again.  Only memory allocated here qualifies (any
    other adjacent views are still copied, so ``DataProto.concat`` keeps
    returning memory of its own), and only once: the first join claims it.
    """
    numel = int(torch.Size(shape).numel())
    itemsize = torch.empty(0, dtype=dtype).element_size()
    raw = np.empty(max(1, numel * itemsize), dtype=np.uint8)
    out = torch.from_numpy(raw)[: numel * itemsize].view(dtype).reshape(shape)
    ptr = out.untyped_storage().data_ptr()

    def forget(ref: weakref.ref[np.ndarray], ptr: int = ptr) -> None:
        with _JOINABLE_LOCK:
            if _JOINABLE.get(ptr) is ref:
                del _JOINABLE[ptr]

    with _JOINABLE_LOCK:
        _JOINABLE[ptr] = weakref.ref(raw, forget)
    return out


def _join_adjacent(tensors: list[torch.Tensor]) -> torch.Tensor | None:
    """One view over ``tensors`` when they are consecutive rows of one joinable buffer."""
    first = tensors[0]
    if first.dim() == 0 or first.device.type != "cpu":
        return None
    storage = first.untyped_storage()
    ptr = storage.data_ptr()
    if ptr not in _JOINABLE:
        return None
    end = first.storage_offset()
    for t in tensors:
        if (
            t.dtype != first.dtype
            or t.shape[1:] != first.shape[1:]
            or t.requires_grad
            or not t.is_contiguous()
            or t.storage_offset() != end
            or t.untyped_storage().data_ptr() != ptr
        ):
            return None
        end += t.numel()
    with _JOINABLE_LOCK:
        ref = _JOINABLE.pop(ptr, None)
    if ref is None or ref() is None:
        return None
    rows = sum(int(t.shape[0]) for t in tensors)
    shape = (rows, *first.shape[1:])
    return first.as_strided(shape, torch.empty(shape, device="meta").stride(), first.storage_offset())


def cat_rows(tensors: list[torch.Tensor]) -> torch.Tensor:
    """``torch.cat`` along rows into memory numpy allocated (or no copy at all).

    numpy advises huge pages for large allocations; torch's CPU allocator
    does not, and page faults made a fresh 64 MB ``torch.cat`` ~1.7x slower
    than the same concatenation into numpy-allocated memory (MEASURED.md).
    Rows an executor received straight into one :func:`joinable_rows`
    buffer, in order, are returned as one view of it: that copy is the one
    the executor already made.
    """
    joined = _join_adjacent(tensors)
    if joined is not None:
        return joined
    first = tensors[0]
    if first.device.type != "cpu" or any(t.requires_grad for t in tensors) or first.dim() == 0:
        return torch.cat(tensors, dim=0)
    shape = (sum(int(t.shape[0]) for t in tensors), *first.shape[1:])
    nbytes = first.element_size() * int(torch.Size(shape).numel())
    if nbytes < _NUMPY_ALLOC_BYTES or any(t.dtype != first.dtype or t.shape[1:] != first.shape[1:] for t in tensors):
        return torch.cat(tensors, dim=0)
    raw = torch.from_numpy(np.empty(nbytes, dtype=np.uint8))
    out = raw.view(first.dtype).reshape(shape)
    return torch.cat(tensors, dim=0, out=out)
