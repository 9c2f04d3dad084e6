"""Where a rollout stream's prompts come from: one DataProto cycled in slices, an iterable of batches, or a callable."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import Any

from .._base import DispatchTypeError, DispatchValueError
from .._data import DataProto


def prompt_batches(prompts: Any, batch_size: int | None) -> Iterator[Any]:
    """The stream's prompt batches, one per generate call, in order (endless for a DataProto or a callable)."""
    if isinstance(prompts, DataProto):
        if batch_size is None:
            raise DispatchValueError(
                "RolloutStream(prompts=<DataProto>) needs batch_size= (rows per generate call); "
                "or pass an iterable of DataProto batches"
            )
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or not 0 < batch_size <= len(prompts):
            raise DispatchValueError(
                f"batch_size must be an int in 1..{len(prompts)} (the prompts' rows), got {batch_size!r}"
            )
        return _cycled(prompts, batch_size)
    if callable(prompts):
        return _called(prompts)
    try:
        return iter(prompts)
    except TypeError:
        raise DispatchTypeError(
            f"prompts must be a DataProto (with batch_size=), an iterable of DataProto batches or a callable "
            f"returning one, got {type(prompts).__name__}"
        ) from None


def _cycled(prompts: DataProto, batch_size: int) -> Iterator[DataProto]:
    starts = range(0, len(prompts) - batch_size + 1, batch_size)
    for start in itertools.cycle(starts):
        yield prompts[start : start + batch_size]


def _called(make: Callable[[], Any]) -> Iterator[Any]:
    while True:
        yield make()
