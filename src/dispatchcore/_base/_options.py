"""Backend options (``WorkerGroup(..., **backend_options)``), checked with one wording."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from typing import Any

from ._errors import DispatchTypeError
from ._hints import did_you_mean

#: The keywords ``WorkerGroup(...)`` takes itself (``name`` included): a misspelt one reaches the
#: backend as an unknown option, and is named before any backend option it also resembles.
#: ``tests/test_error_tree.py`` keeps this equal to ``WorkerGroup.__init__``'s signature.
GROUP_KEYWORDS = (
    "backend",
    "call_timeout",
    "cancel_grace",
    "death_timeout",
    "init_args",
    "init_kwargs",
    "isolate",
    "lazy",
    "lazy_budget_bytes",
    "name",
    "on_rank_death",
    "world_size",
)


def _score(name: str, known: Iterable[str]) -> float:
    """How close ``name`` is to the nearest of ``known`` (difflib's ratio; 0.0 when nothing is near)."""
    ratios = [difflib.SequenceMatcher(None, name.lower(), k.lower()).ratio() for k in known]
    return max((r for r in ratios if r >= 0.6), default=0.0)


def option_hint(name: str, options: Iterable[str], keywords: Iterable[str] = GROUP_KEYWORDS) -> str:
    """Did-you-mean for an unknown option ``name``: a ``WorkerGroup`` keyword first, then a backend option."""
    options, keywords = list(options), list(keywords)
    if _score(name, keywords) >= _score(name, options) and did_you_mean(name, keywords):
        return did_you_mean(name, keywords).replace("did you mean", "did you mean the WorkerGroup keyword")
    return did_you_mean(name, options)


def check_options(backend: str, options: Mapping[str, Any], defaults: Mapping[str, Any]) -> dict[str, Any]:
    """``defaults`` updated with ``options``; an unknown name is a :class:`DispatchTypeError` (a ``TypeError``)
    listing the known ones, with the nearest for a misspelling (a ``WorkerGroup`` keyword before a backend option:
    ``call_timout`` means ``call_timeout``, not the backend's ``start_timeout``)."""
    unknown = sorted(set(options) - set(defaults))
    if unknown:
        known = ", ".join(sorted(defaults)) or "none"
        hints = "".join(option_hint(name, defaults) for name in unknown)
        raise DispatchTypeError(
            f"unknown option(s) {unknown} for the {backend!r} backend{hints}; it takes: {known} "
            f"(pass them as WorkerGroup(..., backend={backend!r}, name=value))"
        )
    return {**defaults, **options}
