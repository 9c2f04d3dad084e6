"""Receive buffers whose consecutive rows one concatenation may adopt.

An executor that receives every rank's rows of one tensor key straight into
slices of one buffer has already made the copy a concatenation would make.
It hands the collect step a :class:`RowBuffers` with the results (as
``CallHandle.row_buffers``); the collect plan hands them to the
concatenation (``cat_rows(tensors, buffers)``), which returns a view spanning
the slices instead of copying them again.  Only buffers of the call being
collected qualify, each once.  A user-defined collect function has verl's
fixed signature and cannot be handed anything, so for it alone the core
opens :func:`adopting` around the call: the one ambient hook, in this layer.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections.abc import Iterator

import torch

from ._buffer_pool import BUFFERS


def numpy_tensor(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised tensor in numpy-allocated memory.

    numpy advises huge pages for large allocations and torch's CPU allocator
    does not: a fresh 64 MB buffer filled through numpy's memory page-faults
    far less (MEASURED.md, "into a fresh tensor"), and large buffers come
    from this process's :data:`~dispatchcore._wire._buffer_pool.BUFFERS`, which
    recycles freed ones.  Use it for every large receive or output buffer.
    """
    numel = int(torch.Size(shape).numel())
    itemsize = torch.empty(0, dtype=dtype).element_size()
    raw = BUFFERS.take(max(1, numel * itemsize))
    return torch.from_numpy(raw)[: numel * itemsize].view(dtype).reshape(shape)


class RowBuffers:
    """The buffers one call's results were received into (claimable once each)."""

    def __init__(self) -> None:
        self._claimable: set[int] = set()
        self._lock = threading.Lock()

    def allocate(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """A fresh buffer to receive rows into; the collect may adopt its row slices."""
        out = numpy_tensor(shape, dtype)
        with self._lock:
            self._claimable.add(out.untyped_storage().data_ptr())
        return out

    def join(self, tensors: list[torch.Tensor]) -> torch.Tensor | None:
        """One view over ``tensors`` if they are consecutive rows of one of these buffers."""
        first = tensors[0]
        if first.dim() == 0 or first.device.type != "cpu":
            return None
        ptr = first.untyped_storage().data_ptr()
        if ptr not in self._claimable:
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
        with self._lock:
            if ptr not in self._claimable:
                return None
            self._claimable.discard(ptr)
        shape = (sum(int(t.shape[0]) for t in tensors), *first.shape[1:])
        return first.as_strided(shape, torch.empty(shape, device="meta").stride(), first.storage_offset())


#: Outputs at least this large are allocated through numpy (see :func:`cat_rows`).
NUMPY_ALLOC_BYTES = 1 << 20


_adopting: contextvars.ContextVar[RowBuffers | None] = contextvars.ContextVar("dispatchcore_rows", default=None)


@contextlib.contextmanager
def adopting(buffers: RowBuffers | None) -> Iterator[None]:
    """Let concatenations in the block adopt rows of ``buffers`` (for collect functions that cannot be handed them)."""
    token = _adopting.set(buffers)
    try:
        yield
    finally:
        _adopting.reset(token)


def cat_rows(tensors: list[torch.Tensor], buffers: RowBuffers | None = None) -> torch.Tensor:
    """``torch.cat`` along rows into numpy-allocated memory, or no copy at all.

    Rows an executor received straight into one of ``buffers`` (default: those
    of an enclosing :func:`adopting` block), in order, come back as one view
    of that buffer.
    """
    if buffers is None:
        buffers = _adopting.get()
    if buffers is not None:
        joined = buffers.join(tensors)
        if joined is not None:
            return joined
    first = tensors[0]
    if first.device.type != "cpu" or any(t.requires_grad for t in tensors) or first.dim() == 0:
        return torch.cat(tensors, dim=0)
    shape = (sum(int(t.shape[0]) for t in tensors), *first.shape[1:])
    nbytes = first.element_size() * int(torch.Size(shape).numel())
    if nbytes < NUMPY_ALLOC_BYTES or any(t.dtype != first.dtype or t.shape[1:] != first.shape[1:] for t in tensors):
        return torch.cat(tensors, dim=0)
    return torch.cat(tensors, dim=0, out=numpy_tensor(shape, first.dtype))
