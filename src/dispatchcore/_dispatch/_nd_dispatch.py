"""Dispatch over a data-parallel axis of an n-d device mesh (verl's nd mode): one ``is_collect`` rank per dp rank."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, cast

from .._base import DispatchError, DispatchValueError
from ._builtin_modes import PerRank, collect_dp_compute_proto, split_dataprotos
from ._call_context import current_call
from ._spec import DispatchSpec

if TYPE_CHECKING:
    from .._data import DataProto
    from ._modes import TypedSpec
    from ._proto_future import DataProtoFuture
    from ._typed_method import CollectsAs


def mesh_layout(mesh_name: str, info: list[tuple[int, bool]]) -> tuple[int, list[int]]:
    """(dp size, positions of the collect ranks in dp order), validated."""
    dp_ranks = [dp for dp, _ in info]
    dp_size = max(dp_ranks) + 1 if dp_ranks else 0
    missing = sorted(set(range(dp_size)) - set(dp_ranks))
    if missing:
        raise DispatchError(f"mesh {mesh_name!r}: no rank declared dp_rank(s) {missing} (got {dp_ranks})")
    collectors: dict[int, int] = {}
    for position, (dp, is_collect) in enumerate(info):
        if not is_collect:
            continue
        if dp in collectors:
            raise DispatchError(
                f"mesh {mesh_name!r}: ranks {collectors[dp]} and {position} both collect dp_rank {dp}; "
                "exactly one rank per dp rank may register is_collect=True"
            )
        collectors[dp] = position
    lacking = sorted(set(range(dp_size)) - set(collectors))
    if lacking:
        raise DispatchError(f"mesh {mesh_name!r}: no rank collects dp_rank(s) {lacking}")
    return dp_size, [collectors[dp] for dp in range(dp_size)]


@functools.cache
def make_nd_compute_dataproto_dispatch_fn(
    mesh_name: str,
) -> TypedSpec[CollectsAs[DataProto], CollectsAs[DataProtoFuture]]:
    """A ``dispatch_mode`` splitting DataProto arguments by dp rank on ``mesh_name``."""
    if not isinstance(mesh_name, str) or not mesh_name:
        raise DispatchValueError(f"mesh_name must be a non-empty string, got {mesh_name!r}")

    def dispatch(wg: Any, *args: Any, **kwargs: Any) -> PerRank:
        info = wg.mesh_ranks(mesh_name)
        dp_size, collect_positions = mesh_layout(mesh_name, info)
        per_dp_args, per_dp_kwargs = split_dataprotos(wg, dp_size, args, kwargs)
        current_call().collect_positions = collect_positions

        # Replicas of one dp rank get the very same chunk object: shipped once.
        def spread(per_dp: list[Any]) -> list[Any]:
            return [per_dp[dp] for dp, _ in info]

        return tuple(spread(a) for a in per_dp_args), {k: spread(v) for k, v in per_dp_kwargs.items()}

    dispatch.__name__ = dispatch.__qualname__ = f"dispatch_nd_{mesh_name}"
    spec = DispatchSpec(
        dispatch, collect_dp_compute_proto, returns_dataproto=True, name=f"nd_compute[{mesh_name}]", builtin=True
    )
    # A plain DispatchSpec: its type arguments exist for checkers only.
    return cast("TypedSpec[CollectsAs[DataProto], CollectsAs[DataProtoFuture]]", spec)
