"""Backend options (``WorkerGroup(..., **backend_options)``), checked with one wording."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ._errors import DispatchTypeError
from ._hints import did_you_mean


def check_options(backend: str, options: Mapping[str, Any], defaults: Mapping[str, Any]) -> dict[str, Any]:
    """``defaults`` updated with ``options``; an unknown name is a :class:`DispatchTypeError` (a ``TypeError``)
    listing the known ones, with the nearest for a misspelling."""
    unknown = sorted(set(options) - set(defaults))
    if unknown:
        known = ", ".join(sorted(defaults)) or "none"
        hints = "".join(did_you_mean(name, defaults) for name in unknown)
        raise DispatchTypeError(
            f"unknown option(s) {unknown} for the {backend!r} backend{hints}; it takes: {known} "
            f"(pass them as WorkerGroup(..., backend={backend!r}, name=value))"
        )
    return {**defaults, **options}
