"""Rank processes keep freed heap memory for reuse instead of mapping fresh pages every step.

glibc's malloc serves each large allocation (a tensor of a few MB and up)
from a fresh ``mmap`` and unmaps it on free, so a rank that makes the same
outputs every step pays the kernel to map and zero every page of them again,
every step.  Measured on the 2-core machine, a loop making 16 MB of tensors
and one 89 MB tensor per step: 21,900 page faults and 45 ms per step by
default, 437 faults and 13 ms with the settings below; in the lazy chain
benchmark (torchrun, N = 4, 64 MB) a step's rank time in the kernel went
from about 5 ms to under 1 ms.  :func:`keep_freed_memory` raises malloc's
mmap and trim thresholds in the calling process (``mallopt``), so those
allocations come from the heap and freed memory stays mapped for the next
step, as PyTorch's own CUDA allocator keeps device memory.

Executors call it in the rank processes they own (never in the user's
driver).  The effect is surest on a process's main thread (torchrun ranks
run workers there).  Ray runs actor methods on a thread of its own, whose
malloc arena Ray's busy internal threads share, so there part of the faults
remain: measured per 48 MiB step, 12,289 faults by default against 0.5 to
1,844 with the setting, varying with the worker process.
The cost is resident memory: a rank keeps up to :func:`kept_bytes` of freed
memory (env ``DISPATCHCORE_KEEP_FREED_MB``; default 1 GiB or 1/16 of
physical memory if less; 0 turns this off).
Nothing changes when the user tuned malloc already (``MALLOC_*_`` variables
or ``GLIBC_TUNABLES``) or the C library is not glibc.

One more trap keeps a freed tensor from being reused: PyTorch allocates
with ``posix_memalign``, which carves a few bytes off each side of a large
block and frees them.  Those small chunks go into the allocating thread's
cache (glibc's tcache: up to 7 chunks per size, never merged with their
neighbours), so while that cache has room they pin every freed block: it
can neither merge back into the heap top nor fit the next aligned request,
and each step maps a fresh block.  Measured, a thread whose cache is empty
faulted all 12,288 pages of a 48 MiB tensor for its first 8 steps, one
whose cache is full for at most 1.  :func:`fill_thread_cache` fills the
calling thread's cache; a rank runs it on its method thread once the
worker is built (the worker's ``__init__`` may have emptied it).
"""

from __future__ import annotations

import ctypes
import os
import platform
from collections.abc import Mapping

from ._buffers import reuse_limit_bytes

#: ``mallopt`` parameters (glibc's malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
#: Allocations up to this size come from the heap (glibc refuses much more; larger ones stay mmap'ed).
_MMAP_THRESHOLD_CAP = 512 << 20
_INT_MAX = (1 << 31) - 1


def kept_bytes(environ: Mapping[str, str] | None = None) -> int:
    """Freed bytes a rank keeps for reuse: ``DISPATCHCORE_KEEP_FREED_MB``, else min(1 GiB, RAM / 16)."""
    return reuse_limit_bytes("DISPATCHCORE_KEEP_FREED_MB", "0 lets freed memory go at once", environ)


def user_tuned_malloc(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the environment already tunes glibc's malloc (then it is left as the user set it)."""
    env = os.environ if environ is None else environ
    return any(name.startswith("MALLOC_") and name.endswith("_") for name in env) or "malloc" in env.get(
        "GLIBC_TUNABLES", ""
    )


def keep_freed_memory(environ: Mapping[str, str] | None = None) -> bool:
    """In this (rank) process: large allocations from the heap, freed memory kept for reuse.

    Returns whether the settings were applied (see the module doc for when
    they are not).  Safe to call more than once.
    """
    keep = kept_bytes(environ)
    if keep == 0 or user_tuned_malloc(environ) or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    trim_ok = mallopt(_M_TRIM_THRESHOLD, min(keep, _INT_MAX))
    ok = bool(mallopt(_M_MMAP_THRESHOLD, min(keep, _MMAP_THRESHOLD_CAP)) and trim_ok)
    global applied
    applied = applied or ok
    return ok


#: Whether :func:`keep_freed_memory` took effect in this process.
applied = False

#: glibc's tcache: per-thread bins for requests of up to 1,032 bytes, 16 bytes apart, 7 chunks each by default.
_TCACHE_LARGEST = 1032
_TCACHE_STEP = 16
_TCACHE_COUNT = 7


def fill_thread_cache() -> None:
    """Fill the calling thread's small-chunk cache, so the bytes aligned allocations trim off merge again.

    Does nothing unless :func:`keep_freed_memory` took effect here (see the
    module doc).  About a millisecond; run it once per thread that will make
    large tensors, after its setup, not per call.
    """
    if not applied:
        return
    libc = ctypes.CDLL(None)
    malloc, free = libc.malloc, libc.free
    malloc.argtypes, malloc.restype = [ctypes.c_size_t], ctypes.c_void_p
    free.argtypes, free.restype = [ctypes.c_void_p], None
    chunks = [malloc(size) for size in range(24, _TCACHE_LARGEST + 1, _TCACHE_STEP) for _ in range(_TCACHE_COUNT)]
    for chunk in chunks:  # freed all at once: each bin ends up full, not one chunk reused over and over
        free(chunk)
