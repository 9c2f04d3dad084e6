"""Modes whose collect reduces the ranks' metrics: one value per name instead of one per rank."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .._base import DispatchError, RegistrationError
from .._data import DataProto
from .._data._metrics import REDUCTIONS, Reduction, metric_values, reduce_metrics
from ._modes import Dispatch, resolve_mode
from ._spec import DispatchSpec


def reduce_metrics_mode(
    how: Reduction | Mapping[str, Reduction] = "mean", mode: Any = Dispatch.DP_COMPUTE_METRIC
) -> DispatchSpec:
    """A ``dispatch_mode``: ``mode`` whose collected metrics are reduced by ``how`` (as ``reduce_metrics`` takes it)."""
    for chosen in how.values() if isinstance(how, Mapping) else [how]:
        if not callable(chosen) and chosen not in REDUCTIONS:
            raise RegistrationError(
                f"reduction {chosen!r} is not one of {sorted(REDUCTIONS)} or a function of the values"
            )
    base = resolve_mode(mode)

    def collect(wg: Any, outputs: list[Any]) -> Any:
        return _reduced(base.collect_fn(wg, outputs), how, base.name)

    return DispatchSpec(**{**base.__dict__, "collect_fn": collect, "name": f"{base.name}+reduce_metrics"})


def _reduced(result: Any, how: Reduction | Mapping[str, Reduction], mode: str) -> Any:
    if isinstance(result, DataProto):
        metrics = result.meta_info.get("metrics")
        if metrics is not None:
            result.meta_info["metrics"] = reduce_metrics(
                metrics if isinstance(metrics, Mapping) else list(metrics), how
            )
        return result
    if isinstance(result, list) and result and all(isinstance(r, Mapping) for r in result):
        return reduce_metrics(result, how)
    if isinstance(result, list) and not isinstance(how, Mapping):
        values = [v for r in result for v in metric_values(r, f"rank results of {mode}")]
        return reduce_metrics({"value": values}, how).get("value") if values else None
    raise DispatchError(
        f"mode {mode} with reduced metrics collected a {type(result).__name__}: its ranks must return metric dicts, "
        "numbers, or DataProtos with meta_info['metrics']"
    )
