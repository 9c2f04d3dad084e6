"""Results of ``blocking=False`` calls: a :class:`CallFuture` resolves to what the mode's collect returns."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Generator, Iterable, Iterator
from typing import Any, Generic, TypeVar

from .._base import DispatchTimeoutError

T = TypeVar("T")

_UNRESOLVED = object()


class CallFuture(Generic[T]):
    """A call's result, available later; exceptions surface at :meth:`get`."""

    def __init__(
        self,
        resolve: Callable[[float | None], T],
        is_done: Callable[[], bool] = lambda: True,
        cancel: Callable[[], bool] | None = None,
    ) -> None:
        self._resolve = resolve
        self._is_done = is_done
        self._cancel = cancel
        self._cancelled = False
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

    def cancel(self) -> bool:
        """Stop the call on every rank of it; ``False`` (nothing changes) if it had already finished.

        :meth:`get` then raises :class:`~dispatchcore.CallCancelledError` (``docs/design.md``, "Cancel").
        """
        if self._cancelled:
            return True
        if self._value is not _UNRESOLVED or self._cancel is None:
            return False
        self._cancelled = self._cancel()
        return self._cancelled

    def cancelled(self) -> bool:
        """Whether :meth:`cancel` stopped this call."""
        return self._cancelled

    def __await__(self) -> Generator[Any, None, T]:
        """``await future`` in an asyncio driver: :meth:`get` runs on a daemon thread, never blocking the loop."""
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


#: Longest pause between two looks at unfinished futures in :func:`as_completed`.
_MAX_PAUSE_S = 0.02


def as_completed(futures: Iterable[CallFuture[T]], timeout: float | None = None) -> Iterator[CallFuture[T]]:
    """Yield each future as its call finishes, as ``concurrent.futures.as_completed`` (any groups, any backends).

    A finished call is seen within 20 ms; past ``timeout`` seconds,
    :class:`~dispatchcore.DispatchTimeoutError` (the calls go on).
    """
    pending = list(dict.fromkeys(futures))
    total = len(pending)
    deadline = None if timeout is None else time.monotonic() + timeout
    pause = 0.0005
    while pending:
        ready = [f for f in pending if f.done()]
        for future in ready:
            pending.remove(future)
            yield future
        if ready:
            pause = 0.0005
            continue
        if deadline is not None and time.monotonic() >= deadline:
            raise DispatchTimeoutError(
                f"{len(pending)} of {total} futures did not finish within {timeout:g} s; "
                "their calls go on running (cancel() them, or get() them later)"
            )
        time.sleep(pause if deadline is None else max(0.0, min(pause, deadline - time.monotonic())))
        pause = min(pause * 2, _MAX_PAUSE_S)
