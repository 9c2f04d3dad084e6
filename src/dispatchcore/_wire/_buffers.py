"""Host buffers for rows: a pool that recycles them, receive buffers whose rows a concatenation adopts.

A freed buffer returns to the pool only when every view made from it is gone, so reuse never aliases
live data (MEASURED.md for why, docs/executor-contract.md for the bounds).
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Iterator, Mapping

import numpy as np
import torch

#: Smaller requests come from numpy directly (the allocator reuses them well).
POOL_MIN_BYTES = 1 << 20
#: Buffers idle this long are let go.
IDLE_SECONDS = 30.0


def reuse_limit_bytes(variable: str, zero_means: str, environ: Mapping[str, str] | None = None) -> int:
    """Bytes from ``variable`` (whole MiB), else min(1 GiB, RAM / 16); ``zero_means`` goes in the error text."""
    env = os.environ if environ is None else environ
    configured = env.get(variable)
    if configured is not None:
        try:
            return max(0, int(configured)) << 20
        except ValueError:
            # A plain ValueError: _wire stands under the error tree (see tests/test_error_tree.py).
            raise ValueError(f"{variable} must be a whole number of MiB ({zero_means}), got {configured!r}") from None
    try:
        physical = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        physical = 16 << 30
    return int(min(1 << 30, physical // 16))


#: Most idle bytes one process keeps (1 GiB, or 1/16 of physical memory if less).
IDLE_LIMIT_BYTES = reuse_limit_bytes("DISPATCHCORE_BUFFER_POOL_MB", "0 turns the pool off")


def size_class(nbytes: int) -> int:
    """``nbytes`` rounded up to one of 8 steps per power of two (at most 1/8 wasted)."""
    step = max(1, (1 << (nbytes.bit_length() - 1)) >> 3)
    return -(-nbytes // step) * step


class BufferPool:
    """Freed large buffers of this process by size class, most recently freed given out first."""

    def __init__(self, idle_limit: int = IDLE_LIMIT_BYTES, idle_seconds: float = IDLE_SECONDS) -> None:
        self.idle_limit = idle_limit
        self.idle_seconds = idle_seconds
        self._lock = threading.Lock()
        #: Buffers just released, not yet filed: finalizers only append here (atomic, no lock), so
        #: one that runs while this thread holds the lock (a collection inside it) cannot deadlock.
        self._released: deque[tuple[int, np.ndarray]] = deque()
        self._idle: dict[int, list[tuple[float, np.ndarray]]] = {}
        #: Release order (size class, release time), oldest first, for trimming.
        self._order: deque[tuple[int, float]] = deque()
        self._idle_bytes = 0
        self.reused = 0

    def take(self, nbytes: int) -> np.ndarray:
        """A writable ``uint8`` array of ``nbytes`` whose memory nothing else can see."""
        if nbytes < POOL_MIN_BYTES or self.idle_limit <= 0:
            return np.empty(nbytes, dtype=np.uint8)
        cls = size_class(nbytes)
        raw = None
        with self._lock:
            self._file_released()
            free = self._idle.get(cls)
            if free:
                raw = free.pop()[1]
                self._idle_bytes -= cls
                self.reused += 1
        if raw is None:
            raw = np.empty(cls, dtype=np.uint8)
        view = raw[:nbytes]
        weakref.finalize(view, self._release, raw, cls).atexit = False
        return view

    def _release(self, raw: np.ndarray, cls: int) -> None:
        self._released.append((cls, raw))
        if self._lock.acquire(blocking=False):  # busy (maybe this very thread): the next request files it
            try:
                self._file_released()
            finally:
                self._lock.release()

    def _file_released(self) -> None:
        """File the buffers released since, then let go of what is over the bounds (lock held)."""
        now = time.monotonic()  # filing time, taken under the lock: every list stays in time order
        while self._released:
            cls, raw = self._released.popleft()
            self._idle.setdefault(cls, []).append((now, raw))
            self._order.append((cls, now))
            self._idle_bytes += cls
        while self._order:
            cls, released = self._order[0]
            free = self._idle.get(cls)
            # Entries of buffers given out again are stale: skip them.
            if not free or free[0][0] > released:
                self._order.popleft()
                continue
            if self._idle_bytes <= self.idle_limit and now - released < self.idle_seconds:
                return
            self._order.popleft()
            free.pop(0)
            self._idle_bytes -= cls

    def idle_bytes(self) -> int:
        with self._lock:
            self._file_released()
            return self._idle_bytes

    def clear(self) -> None:
        """Let go of every idle buffer."""
        with self._lock:
            self._released.clear()
            self._idle.clear()
            self._order.clear()
            self._idle_bytes = 0


#: The pool of this process.
BUFFERS = BufferPool()


def receive_buffer(nbytes: int) -> np.ndarray:
    """A writable ``uint8`` buffer of ``nbytes`` that nothing else can see (large ones recycled from the pool)."""
    return BUFFERS.take(nbytes)


def numpy_tensor(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised tensor in numpy-allocated memory (huge pages, pooled): for every large buffer."""
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

    Consecutive rows received into one of ``buffers`` (default: those of an
    enclosing :func:`adopting` block) come back as one view of that buffer.
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
