"""Backend options (``WorkerGroup(..., **backend_options)``), checked with one wording."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def check_options(backend: str, options: Mapping[str, Any], defaults: Mapping[str, Any]) -> dict[str, Any]:
    """``defaults`` updated with ``options``; an unknown name is a ``TypeError`` listing the known ones."""
    unknown = sorted(set(options) - set(defaults))
    if unknown:
        known = ", ".join(sorted(defaults)) or "none"
        raise TypeError(
            f"unknown option(s) {unknown} for the {backend!r} backend; it takes: {known} "
            f"(pass them as WorkerGroup(..., backend={backend!r}, name=value))"
        )
    return {**defaults, **options}
