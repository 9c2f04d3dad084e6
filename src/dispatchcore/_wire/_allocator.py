"""Rank processes keep freed heap memory for reuse instead of mapping fresh pages every step.

:func:`keep_freed_memory` raises glibc malloc's mmap and trim thresholds; docs/benchmarks.md
gives the effect and the bound.  One more trap: ``posix_memalign`` trims a few bytes off each large
block into the thread's tcache, where they pin every freed block while the cache has room (a 48 MiB
tensor faulted all its pages for 8 steps); :func:`fill_thread_cache` fills it once per method thread.
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


def keep_freed_memory(environ: Mapping[str, str] | None = None) -> bool:
    """In this (rank) process: keep freed memory for reuse; whether it was applied (safe to call again)."""
    # Freed bytes kept for reuse: DISPATCHCORE_KEEP_FREED_MB, else min(1 GiB, RAM / 16).
    keep = reuse_limit_bytes("DISPATCHCORE_KEEP_FREED_MB", "0 lets freed memory go at once", environ)
    env = os.environ if environ is None else environ  # a malloc the user tuned is left as they set it
    tuned = any(name.startswith("MALLOC_") and name.endswith("_") for name in env) or "malloc" in env.get(
        "GLIBC_TUNABLES", ""
    )
    if keep == 0 or tuned or platform.libc_ver()[0] != "glibc":
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
    """Fill this thread's small-chunk cache (if :func:`keep_freed_memory` applied): once per thread, ~1 ms."""
    if not applied:
        return
    libc = ctypes.CDLL(None)
    malloc, free = libc.malloc, libc.free
    malloc.argtypes, malloc.restype = [ctypes.c_size_t], ctypes.c_void_p
    free.argtypes, free.restype = [ctypes.c_void_p], None
    chunks = [malloc(size) for size in range(24, _TCACHE_LARGEST + 1, _TCACHE_STEP) for _ in range(_TCACHE_COUNT)]
    for chunk in chunks:  # freed all at once: each bin ends up full, not one chunk reused over and over
        free(chunk)
