"""How much freed memory a process may keep for reuse: one rule for every such cache.

Both the buffer pool and the rank allocator settings (``_allocator``) trade
resident memory for page faults saved; they share the default (1 GiB, or
1/16 of physical memory if that is less) and the way an environment
variable, in MiB, overrides it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping


def reuse_limit_bytes(variable: str, zero_means: str, environ: Mapping[str, str] | None = None) -> int:
    """Bytes from ``variable`` (whole MiB), else min(1 GiB, RAM / 16); ``zero_means`` goes in the error text."""
    env = os.environ if environ is None else environ
    configured = env.get(variable)
    if configured is not None:
        try:
            return max(0, int(configured)) << 20
        except ValueError:
            raise ValueError(f"{variable} must be a whole number of MiB ({zero_means}), got {configured!r}") from None
    try:
        physical = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        physical = 16 << 30
    return int(min(1 << 30, physical // 16))
