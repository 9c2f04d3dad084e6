"""Results of ``blocking=False`` calls.

A :class:`CallFuture` resolves to whatever the mode's collect returns.  A
:class:`DataProtoFuture` resolves to one trimmed ``DataProto`` and can be
passed straight into another group's call: an executor that can move rows
rank to rank forwards it (``Executor.forward_future``) so the driver never
pulls the batch; otherwise the core resolves it on the driver.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Generator, Sequence
from typing import TYPE_CHECKING, Any, Generic, TypeVar

if TYPE_CHECKING:
    from .._data._dataproto import DataProto
    from .._spi._call import Call
    from .._spi._executor_base import CallHandle, Executor

T = TypeVar("T")

_UNRESOLVED = object()


class CallFuture(Generic[T]):
    """A call's result, available later; exceptions surface at :meth:`get`."""

    def __init__(
        self,
        resolve: Callable[[float | None], T],
        is_done: Callable[[], bool] = lambda: True,
    ) -> None:
        self._resolve = resolve
        self._is_done = is_done
        self._value: Any = _UNRESOLVED
        self._lock = threading.Lock()

    def get(self, timeout: float | None = None) -> T:
        """Wait for the result (``timeout`` overrides the group's call bound)."""
        with self._lock:
            if self._value is _UNRESOLVED:
                self._value = self._resolve(timeout)
            return self._value  # type: ignore[no-any-return]

    def result(self, timeout: float | None = None) -> T:
        """Alias of :meth:`get` (``concurrent.futures`` spelling)."""
        return self.get(timeout)

    def done(self) -> bool:
        """Whether :meth:`get` would return without waiting."""
        return self._value is not _UNRESOLVED or self._is_done()

    def __await__(self) -> Generator[Any, None, T]:
        """``await future`` in an asyncio driver: waits without blocking the event loop.

        A resolved future answers at once; otherwise :meth:`get` runs on a
        daemon thread (the call's own bounds apply; a hung rank never keeps
        the interpreter from exiting) and hands its value or exception to
        the loop.  Independent futures resolve concurrently under
        ``asyncio.gather``.
        """
        if self._value is not _UNRESOLVED:
            return self._value  # type: ignore[no-any-return]
        return (yield from self._resolve_in_thread().__await__())

    def _resolve_in_thread(self) -> asyncio.Future[T]:
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[T] = loop.create_future()

        def settle(outcome: Callable[[], None]) -> None:
            if not waiter.done():  # cancelled meanwhile: nobody wants the value
                outcome()

        def wait() -> None:
            try:
                value = self.get()
            except BaseException as exc:  # noqa: BLE001 - handed to the awaiting task
                error = exc
                post = lambda: settle(lambda: waiter.set_exception(error))  # noqa: E731
            else:
                post = lambda: settle(lambda: waiter.set_result(value))  # noqa: E731
            try:
                loop.call_soon_threadsafe(post)
            except RuntimeError:  # the loop closed while the call ran
                pass

        threading.Thread(target=wait, name="dispatchcore-await", daemon=True).start()
        return waiter


class DataProtoFuture(CallFuture["DataProto"]):
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
    ) -> None:
        super().__init__(resolve, is_done)
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
        from .._data._dataproto import DataProto

        parts = list(futures)
        if not parts:
            raise ValueError("DataProtoFuture.concat needs at least one future, got an empty list")
        return cls(
            lambda timeout: DataProto.concat([f.get(timeout) for f in parts]),
            lambda: all(f.done() for f in parts),
        )

    def chunk(self, chunks: int) -> list[DataProtoFuture]:
        """``chunks`` futures, the i-th resolving to ``self.get().chunk(chunks)[i]``."""
        if chunks <= 0:
            raise ValueError(f"chunk count must be positive, got {chunks}")

        def piece(i: int) -> Callable[[float | None], DataProto]:
            return lambda timeout: self.get(timeout).chunk(chunks)[i]

        return [DataProtoFuture(piece(i), self.done) for i in range(chunks)]
