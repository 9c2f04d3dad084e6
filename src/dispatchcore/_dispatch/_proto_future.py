"""``DataProtoFuture``: a ``DataProto`` a call is still producing (verl's name), forwardable rank to rank."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from .._base import DispatchValueError
from .._data import DataProto
from ._futures import _UNRESOLVED, CallFuture

if TYPE_CHECKING:
    from .._spi import Call, CallHandle, Executor


class DataProtoFuture(CallFuture[DataProto]):
    """A ``DataProto`` that a call is still producing (verl's name)."""

    def __init__(
        self,
        resolve: Callable[[float | None], DataProto],
        is_done: Callable[[], bool] = lambda: True,
        *,
        handle: CallHandle | None = None,
        executor: Executor | None = None,
        call: Call | None = None,
        collect_positions: list[int] | None = None,
        pad_size: int = 0,
        padded_len: int = 0,
        cancel: Callable[[], bool] | None = None,
    ) -> None:
        super().__init__(resolve, is_done, cancel)
        #: What an executor needs to forward the rows without the driver.
        self.handle = handle
        self.executor = executor
        self.call = call
        self.collect_positions = collect_positions
        self.pad_size = pad_size
        self.padded_len = padded_len

    def done_on_driver(self) -> bool:
        """Whether the value was already brought to the driver (then forwarding gains nothing)."""
        return self._value is not _UNRESOLVED

    @classmethod
    def concat(cls, futures: Sequence[DataProtoFuture]) -> DataProtoFuture:
        """One future resolving to the concatenation of ``futures``."""
        parts = list(futures)
        if not parts:
            raise DispatchValueError("DataProtoFuture.concat needs at least one future, got an empty list")
        return cls(
            lambda timeout: DataProto.concat([f.get(timeout) for f in parts]),
            lambda: all(f.done() for f in parts),
        )

    def chunk(self, chunks: int) -> list[DataProtoFuture]:
        """``chunks`` futures, the i-th resolving to ``self.get().chunk(chunks)[i]``."""
        if chunks <= 0:
            raise DispatchValueError(f"chunk count must be positive, got {chunks}")

        def piece(i: int) -> Callable[[float | None], DataProto]:
            return lambda timeout: self.get(timeout).chunk(chunks)[i]

        return [DataProtoFuture(piece(i), self.done) for i in range(chunks)]
