"""The built-in dispatch modes' driver-side functions (docs/design.md, "Invariants"; table: docs/dispatch-modes.md)."""

from __future__ import annotations

from typing import Any, Protocol, cast

import torch

from .._base import BatchSizeError, DispatchError, DispatchTypeError
from .._data import (
    PADDING_ROWS_KEY,
    DataProto,
    chunk_tensordict,
    chunk_with_padding,
    concat_tensordicts,
    is_tensordict,
    kept_result_rows,
    slice_rows,
)
from .._spi import plan_forward, trimmed_rows
from .._wire import RowBuffers
from ._call_context import current_call
from ._modes import Dispatch, set_builtin
from ._proto_future import DataProtoFuture
from ._spec import DispatchSpec

PerRank = tuple[tuple[list[Any], ...], dict[str, list[Any]]]


class _LazyRows(Protocol):
    """A ``LazyDataProto`` as the modes use it (the lazy-results plane is built on this layer's futures)."""

    def bring_unreachable_rows(self, executor: Any) -> None: ...


def broadcast(wg: Any, *args: Any, **kwargs: Any) -> PerRank:
    """Every rank gets every argument whole (the same object: shipped once)."""
    n = int(wg.world_size)
    return tuple([a] * n for a in args), {k: [v] * n for k, v in kwargs.items()}


def dispatch_all_to_all(wg: Any, *args: Any, **kwargs: Any) -> PerRank:
    """verl's rule: split when every argument is a world-size list, else broadcast."""
    n = int(wg.world_size)
    values = list(args) + list(kwargs.values())
    if values and all(isinstance(v, list) and len(v) == n for v in values):
        return tuple(list(a) for a in args), {k: list(v) for k, v in kwargs.items()}
    return broadcast(wg, *args, **kwargs)


def collect_list(wg: Any, outputs: list[Any]) -> list[Any]:
    return list(outputs)


def collect_rank_zero(wg: Any, outputs: list[Any]) -> Any:
    return outputs[0]


def dispatch_dp_compute(wg: Any, *args: Any, **kwargs: Any) -> PerRank:
    """Element i of each list/tuple argument goes to rank i."""
    n = int(wg.world_size)
    for where, v in [(f"argument {i}", a) for i, a in enumerate(args)] + [
        (f"keyword {k!r}", v) for k, v in kwargs.items()
    ]:
        if not isinstance(v, (list, tuple)) or len(v) != n:
            got = f"a {type(v).__name__} of length {len(v)}" if isinstance(v, (list, tuple)) else repr(type(v))
            raise BatchSizeError(
                f"Dispatch.DP_COMPUTE needs every argument to be a list or tuple with one entry per "
                f"rank ({n}); {where} is {got}"
            )
    return tuple(list(a) for a in args), {k: list(v) for k, v in kwargs.items()}


def _chunk_value(wg: Any, value: Any, n: int) -> list[Any] | None:
    """Per-rank chunks of a DataProto or future, or None for other values."""
    ctx = current_call()
    if type(value) is DataProto:  # the common case: none of the checks below can apply
        return _chunk_dataproto(value, n, ctx)
    if isinstance(value, DataProtoFuture):
        parts = _forward(getattr(wg, "executor", None), value, n, ctx)
        if parts is not None:
            return parts
        value = value.get()
    if isinstance(value, DataProto):
        if value.is_lazy:  # a LazyDataProto: rows the ranks cannot fetch come to the driver once, before chunking
            cast(_LazyRows, value).bring_unreachable_rows(getattr(wg, "executor", None))
        return _chunk_dataproto(value, n, ctx)
    if is_tensordict(value):
        chunks = chunk_tensordict(value, n)
        _note_padding(ctx, 0, len(value))
        return chunks
    return None


def _chunk_dataproto(value: DataProto, n: int, ctx: Any) -> list[Any]:
    try:
        value.check_consistency()  # a column mutated to another length would split out of step
    except (BatchSizeError, TypeError) as exc:
        raise BatchSizeError(f"call {ctx.method!r}: a DataProto argument is inconsistent: {exc}") from exc
    chunks, pad_size = chunk_with_padding(value, n, allow_padding=value.is_padding_enabled())
    _note_padding(ctx, pad_size, len(value) + pad_size)
    return chunks


def _forward(executor: Any, future: DataProtoFuture, n: int, ctx: Any) -> list[Any] | None:
    """Per-rank placeholders that let the ranks fetch ``future``'s rows themselves (same backend only), or ``None``."""
    handle = future.handle
    if executor is None or handle is None or future.executor is None or future.executor.name != executor.name:
        return None
    if future.call is None or not future.call.results_are_copied or future.done_on_driver():
        return None
    if future.call.instructions.keep_rows is not None:  # a lazy call: its result is cheap to get and forwards itself
        return None
    shapes = executor.describe_results(handle)
    if shapes is None:
        return None
    plan = plan_forward(
        shapes, n, collect_positions=future.collect_positions, pad_size=future.pad_size, padded_len=future.padded_len
    )
    if plan is None:
        return None
    _note_padding(ctx, plan.pad_size, plan.padded_len)
    return [executor.forward_chunk(handle, chunk) for chunk in plan.chunks]


def _note_padding(ctx: Any, pad_size: int, padded_len: int) -> None:
    # Compared with the first split argument even when that one was empty (padded_len 0).
    if ctx.extra.setdefault("split_shape", (padded_len, pad_size)) != (padded_len, pad_size):
        raise BatchSizeError(
            f"call {ctx.method!r}: DataProto arguments have different lengths "
            f"({ctx.padded_len - ctx.pad_size} and {padded_len - pad_size} rows after the same split)"
        )
    ctx.pad_size, ctx.padded_len = pad_size, padded_len


def split_dataprotos(wg: Any, n: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> PerRank:
    """Chunk DataProto/future arguments ``n`` ways; broadcast everything else."""
    out: list[list[Any]] = []
    split = False
    for value in (*args, *kwargs.values()):
        chunks = _chunk_value(wg, value, n)
        split = split or chunks is not None
        out.append(chunks if chunks is not None else [value] * n)
    if not split and out:
        # A DataProto mode given no DataProto would concatenate n copies of the answer: a type error.
        got = [type(a).__name__ for a in args] + [f"{k}={type(v).__name__}" for k, v in kwargs.items()]
        raise DispatchTypeError(
            f"call {current_call().method!r} splits DataProto arguments over the ranks, but none of its arguments "
            f"is a DataProto, DataProtoFuture or TensorDict (got {', '.join(got)}). Pass the batch as a DataProto, "
            "e.g. DataProto.from_dict({...}), or register the method with Dispatch.ONE_TO_ALL to send every "
            "argument whole"
        )
    return tuple(out[: len(args)]), dict(zip(kwargs, out[len(args) :], strict=True))


def dispatch_dp_compute_proto(wg: Any, *args: Any, **kwargs: Any) -> PerRank:
    return split_dataprotos(wg, int(wg.world_size), args, kwargs)


def dispatch_dp_compute_proto_with_func(wg: Any, *args: Any, **kwargs: Any) -> PerRank:
    if not args or not callable(args[0]):
        raise DispatchError(
            "Dispatch.DP_COMPUTE_PROTO_WITH_FUNC takes a function as its first argument, got "
            f"{type(args[0]).__name__ if args else 'no arguments'}"
        )
    n = int(wg.world_size)
    rest_args, rest_kwargs = split_dataprotos(wg, n, args[1:], kwargs)
    return ([args[0]] * n, *rest_args), rest_kwargs


def trim_padding(result: Any, pad_size: int, padded_len: int) -> Any:
    """Drop the rows that padding produced, never whole worker results."""
    if pad_size <= 0 or not (isinstance(result, (DataProto, torch.Tensor)) or is_tensordict(result)):
        return result
    keep = trimmed_rows(len(result), pad_size, padded_len)
    if keep < 0:
        return result
    return slice_rows(result, 0, keep) if is_tensordict(result) else result[:keep]


def concat_outputs(outputs: list[Any], ranks: list[int] | None = None, row_buffers: RowBuffers | None = None) -> Any:
    """One DataProto (or tensor) from per-rank outputs, in order, adopting rows from ``row_buffers``."""
    try:
        if outputs and all(isinstance(o, DataProto) for o in outputs):
            return DataProto.concat(outputs, row_buffers=row_buffers)
        if outputs and all(isinstance(o, torch.Tensor) for o in outputs):
            return torch.cat(outputs)
        if outputs and all(is_tensordict(o) for o in outputs):
            return concat_tensordicts(outputs)
    except (ValueError, TypeError, RuntimeError) as exc:
        ranks = list(range(len(outputs))) if ranks is None else ranks
        raise DispatchError(
            f"call {current_call().method!r}: the DataProto results of ranks {ranks} cannot be concatenated "
            f"({exc}); every rank must return the same keys, dtypes and meta_info"
        ) from exc
    if all(o is None for o in outputs):
        return None
    ranks = list(range(len(outputs))) if ranks is None else ranks
    wrong = {r: type(o).__name__ for r, o in zip(ranks, outputs, strict=True) if not isinstance(o, DataProto)}
    raise DispatchError(
        f"call {current_call().method!r} collects one DataProto from its ranks, so every rank must return a "
        f"DataProto (or a tensor, or all None); got {', '.join(f'rank {r}: {k}' for r, k in wrong.items())}. "
        "Return a DataProto from the worker method, or register it with Dispatch.ONE_TO_ALL or "
        "Dispatch.DP_COMPUTE_METRIC to get the per-rank list"
    )


def _rows_to_keep(picked: list[Any], ranks: list[int], pad_size: int, padded_len: int) -> int | None:
    """Real rows at the head of the concatenated ``picked`` results (per rank), or ``None``: keep all."""
    if pad_size <= 0 or not all(isinstance(o, (DataProto, torch.Tensor)) or is_tensordict(o) for o in picked):
        return None
    try:
        return kept_result_rows([len(o) for o in picked], pad_size, padded_len, ranks)
    except BatchSizeError as exc:
        raise BatchSizeError(f"call {current_call().method!r}: {exc}") from None


def collect_dp_compute_proto(wg: Any, outputs: list[Any]) -> Any:
    ctx = current_call()
    positions = ctx.collect_positions
    buffers = ctx.row_buffers
    ranks = list(range(len(outputs))) if positions is None else list(positions)
    picked = outputs if positions is None else [outputs[i] for i in positions]
    keep = _rows_to_keep(picked, ranks, ctx.pad_size, ctx.padded_len)  # checked before anything is copied
    result = concat_outputs(picked, ranks, buffers)
    if isinstance(result, DataProto):
        result.meta_info.pop(PADDING_ROWS_KEY, None)
    if keep is None or keep >= len(result):
        return result
    return slice_rows(result, 0, keep) if is_tensordict(result) else result[:keep]


def _direct_only(wg: Any, *args: Any, **kwargs: Any) -> PerRank:
    raise DispatchError("Dispatch.DIRECT_ROLLOUT_METHOD methods are called on the workers directly")


def _install() -> None:
    specs = {
        "ALL_TO_ALL": DispatchSpec(dispatch_all_to_all, collect_list),
        "ONE_TO_ALL": DispatchSpec(broadcast, collect_list),
        "RANK_ZERO": DispatchSpec(broadcast, collect_rank_zero, rank_zero_only=True),
        "DP_COMPUTE": DispatchSpec(dispatch_dp_compute, collect_list),
        "DP_COMPUTE_PROTO": DispatchSpec(dispatch_dp_compute_proto, collect_dp_compute_proto, returns_dataproto=True),
        "DP_COMPUTE_PROTO_WITH_FUNC": DispatchSpec(
            dispatch_dp_compute_proto_with_func, collect_dp_compute_proto, returns_dataproto=True
        ),
        "DP_COMPUTE_METRIC": DispatchSpec(dispatch_dp_compute_proto, collect_list),
        "DIRECT_ROLLOUT_METHOD": DispatchSpec(_direct_only, collect_list, direct=True),
    }
    for name, spec in specs.items():
        set_builtin(Dispatch[name], DispatchSpec(**{**spec.__dict__, "name": name, "builtin": True}))


_install()
