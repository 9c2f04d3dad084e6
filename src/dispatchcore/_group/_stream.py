"""Results as ranks finish: ``for part in wg.generate.stream(batch): ...`` (``docs/calls-that-cannot-hang.md``)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from .._base import DispatchTimeoutError
from .._data import PADDING_ROWS_KEY, DataProto
from .._rows import LazyDataProto, RemoteRows
from .._spi import remaining
from .._trace import TimedResult


@dataclass(frozen=True)
class StreamPart:
    """One rank's part of a streamed call: its ``ranks``, its ``value`` (padding dropped), and for
    DataProto modes the input ``rows`` it covers."""

    ranks: tuple[int, ...]
    value: Any
    rows: range | None = None


class CallStream(Iterator[StreamPart]):
    """The parts of one call, as its ranks finish (or in rank order); also a context manager."""

    def __init__(
        self,
        ledger: Any,
        planned: Any,
        submitted: Any,
        ordered: bool,
        timeout: float | None,
        on_error: Callable[[BaseException], None],
        on_close: Callable[[], bool],
    ) -> None:
        self._ledger = ledger
        self._on_close = on_close
        self._planned = planned
        self._handle = submitted.handle
        self._trace = submitted.trace
        self._ordered = ordered
        self._deadline = None if timeout is None else time.monotonic() + timeout
        self._timeout = timeout
        self._on_error = on_error
        positions = planned.context.collect_positions
        self._order = list(range(len(planned.call.ranks))) if positions is None else list(positions)
        self._left = list(self._order)
        self._done = False

    def __iter__(self) -> CallStream:
        return self

    def __next__(self) -> StreamPart:
        if self._done or not self._left:
            self._done = True
            self._release()
            raise StopIteration
        try:
            position = self._next_position()
        except BaseException as exc:
            self._done = True
            self._on_error(exc)
            raise
        index = self._order.index(position)
        self._left.remove(position)
        found = self._handle.position_outcome(position)
        assert found is not None and found[0]  # noqa: S101 - _next_position returns answered ranks only
        value = found[1]
        if self._trace is not None:
            value = self._trace.rank_done(self._planned.call.ranks[position], value)
        elif isinstance(value, TimedResult):
            value = value.value
        part = self._part(position, index, value)
        if not self._left:
            self._done = True
            self._release()
        return part

    def _next_position(self) -> int:
        """The next rank to hand out: the first answered one (or the next in order); raises its error."""
        handle: Any = self._handle
        while True:
            handle.arm()
            candidates = self._left[:1] if self._ordered else self._left
            for position in candidates:
                found = handle.position_outcome(position)
                if found is not None:
                    if not found[0]:
                        handle.result(remaining(self._deadline))  # raises the call's error (the failure, the death)
                    return position
            if handle.ended():
                handle.result(remaining(self._deadline))  # ended early: cancelled, or a rank raised or died elsewhere
            now = time.monotonic()
            if self._deadline is not None and now >= self._deadline:
                raise DispatchTimeoutError(
                    f"stream of {self._planned.call.method!r} got no part within its {self._timeout:g} s timeout",
                    method=self._planned.call.method,
                    ranks=tuple(handle.waiting_ranks()),
                )
            wait = handle.poll if self._deadline is None else min(handle.poll, self._deadline - now)
            handle.wait_for_any(max(0.001, wait))

    def _part(self, position: int, index: int, value: Any) -> StreamPart:
        planned = self._planned
        rank = planned.call.ranks[position]
        if planned.lazy:
            (adopted,) = self._ledger.adopt((rank,), [value])
            value = LazyDataProto.of_remote(adopted) if isinstance(adopted, RemoteRows) else adopted
        if not planned.spec.returns_dataproto:
            return StreamPart((rank,), value)
        ctx = planned.context
        parts = len(self._order)
        chunk = ctx.padded_len // parts if parts and ctx.padded_len else 0
        real = ctx.padded_len - ctx.pad_size
        start = min(index * chunk, real)
        end = min((index + 1) * chunk, real)
        if isinstance(value, DataProto):
            value.meta_info.pop(PADDING_ROWS_KEY, None)
            if chunk and end - start < chunk and len(value) % chunk == 0:
                value = value[: len(value) // chunk * (end - start)]
        return StreamPart((rank,), value, range(start, end) if chunk else None)

    def cancel(self) -> bool:
        """Stop the ranks still running the call; ``False`` if it had finished."""
        if self._done:
            return False
        self._done = True
        return self._on_close()

    def close(self) -> None:
        """Leave the stream: the call is cancelled on the ranks still running it."""
        self.cancel()

    def _release(self) -> None:
        del self._planned.read_sources[:]

    def __enter__(self) -> CallStream:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001, S110 - at collection: nothing to report to
            pass
