"""Reducing per-rank metrics to the one number a trainer logs (docs/metrics.md)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from dispatchcore._base._errors import DispatchTypeError, DispatchValueError

__all__ = ["REDUCTIONS", "Reduction", "metric_values", "reduce_metrics"]

#: One reduction: a name from :data:`REDUCTIONS` or a function of the list of values.
Reduction = str | Callable[[list[Any]], Any]


def _mean(values: list[Any]) -> float:
    return math.fsum(values) / len(values)


def _sum(values: list[Any]) -> Any:
    return sum(values) if all(isinstance(v, int) for v in values) else math.fsum(values)


def _extreme(pick: Callable[..., Any]) -> Callable[[list[Any]], Any]:
    def reduce(values: list[Any]) -> Any:
        return math.nan if any(isinstance(v, float) and math.isnan(v) for v in values) else pick(values)

    return reduce


#: The built-in reductions by name (``max``/``min`` give NaN where a value is NaN, as numpy does).
REDUCTIONS: dict[str, Callable[[list[Any]], Any]] = {
    "mean": _mean,
    "sum": _sum,
    "max": _extreme(max),
    "min": _extreme(min),
}


def metric_values(value: Any, name: str = "metric") -> list[Any]:
    """A metric's values as Python numbers: one number, or every element of a list, array or tensor."""
    if isinstance(value, torch.Tensor):
        return list(value.detach().to("cpu").reshape(-1).tolist())
    if isinstance(value, np.ndarray):
        return (
            [metric_values(v, name)[0] for v in value.reshape(-1)] if value.dtype == object else value.ravel().tolist()
        )
    if isinstance(value, np.generic):
        return [value.item()]
    if isinstance(value, bool | int | float):
        return [value]
    if isinstance(value, list | tuple):
        return [v for item in value for v in metric_values(item, name)]
    raise DispatchTypeError(
        f"metric {name!r} is a {type(value).__name__}; a metric is a number, a 0-dim tensor, or a list, array "
        "or tensor of numbers"
    )


def _reduction(how: Reduction | Mapping[str, Reduction], name: str) -> Callable[[list[Any]], Any]:
    chosen = how.get(name, "mean") if isinstance(how, Mapping) else how
    if callable(chosen):
        return chosen
    found = REDUCTIONS.get(chosen) if isinstance(chosen, str) else None
    if found is None:
        raise DispatchValueError(
            f"metric {name!r}: reduction {chosen!r} is not one of {sorted(REDUCTIONS)} or a function of the values"
        )
    return found


def reduce_metrics(
    metrics: Sequence[Mapping[str, Any]] | Mapping[str, Any], how: Reduction | Mapping[str, Reduction] = "mean"
) -> dict[str, Any]:
    """One value per metric name, from per-rank dicts (``[{name: value}, ...]``) or a dict of lists.

    ``how``: ``"mean"`` (verl's default), ``"sum"``, ``"max"``, ``"min"``, a
    function of the values, or a mapping from name to one of those (others
    are meant); see docs/metrics.md.
    """
    gathered: dict[str, list[Any]] = {}
    parts = [metrics] if isinstance(metrics, Mapping) else list(metrics)
    for part in parts:
        if not isinstance(part, Mapping):
            raise DispatchTypeError(
                f"reduce_metrics takes per-rank dicts or one dict of lists; got a {type(part).__name__} among them"
            )
        for name, value in part.items():
            gathered.setdefault(name, []).extend(metric_values(value, name))
    return {name: _reduction(how, name)(values) for name, values in gathered.items() if values}
