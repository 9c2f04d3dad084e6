"""The one exception tree of dispatchcore.

Every exception raised on purpose by the library derives from
:class:`DispatchError` and also from the builtin it most resembles, so a
caller can catch either::

    DispatchError (Exception)
    ├── RegistrationError (ValueError)      bad @register / dispatch-mode input
    ├── BatchSizeError (ValueError)         a batch that cannot be split as asked
    ├── BackendNotFoundError (LookupError)  unknown backend or missing extra
    ├── UnpicklableError (TypeError)        a value the ranks need cannot be pickled (nothing was sent)
    ├── WorkerError (RuntimeError)          a worker method raised
    ├── WorkerDiedError (RuntimeError)      a worker process/actor/thread is gone
    ├── DispatchTimeoutError (TimeoutError) a call outlived its timeout
    └── CallCancelledError (CancelledError) a call was cancelled

    CallInterrupted (BaseException)          raised inside a cancelled worker method

Backend exceptions are translated into these at each executor's boundary
(``raise ... from exc``).
"""

from __future__ import annotations

import concurrent.futures
from typing import Any


class DispatchError(Exception):
    """Base of every dispatchcore exception."""


class RegistrationError(DispatchError, ValueError):
    """A dispatch mode, execute mode or ``@register`` option is invalid."""


class BatchSizeError(DispatchError, ValueError):
    """A batch's length does not fit the requested split."""


class BackendNotFoundError(DispatchError, LookupError):
    """The requested backend is unknown or its extra is not installed."""


class UnpicklableError(DispatchError, TypeError):
    """A worker class, init argument or call argument cannot be pickled for the ranks; nothing was sent.

    ``where`` is the path to the object at fault (``argument 'cfg' →
    cfg['callback']``, ``worker class W → Registry.lock``); ``in_process``
    says the pickling was for isolation inside this process (``local``),
    where callables and classes are shared, not pickled.
    """

    def __init__(self, message: str, *, where: str = "", method: str | None = None, in_process: bool = False) -> None:
        super().__init__(message)
        self.where = where
        self.method = method
        self.in_process = in_process

    def __reduce__(self) -> tuple[Any, ...]:
        return (_unpicklable_error, (str(self), self.where, self.method, self.in_process))


class WorkerError(DispatchError, RuntimeError):
    """A worker method raised; carries where and the remote traceback."""

    def __init__(
        self,
        rank: int,
        method: str,
        remote_traceback: str,
        exc_type: str = "Exception",
        exc_message: str = "",
    ) -> None:
        self.rank = rank
        self.method = method
        self.remote_traceback = remote_traceback
        self.exc_type = exc_type
        self.exc_message = exc_message
        super().__init__(rank, method, remote_traceback, exc_type, exc_message)

    def __str__(self) -> str:
        head = f"worker rank {self.rank} raised {self.exc_type}: {self.exc_message}"
        head += f" (in method {self.method!r})"
        tb = self.remote_traceback.rstrip()
        if not tb:
            return head
        return f"{head}\n\n--- remote traceback (rank {self.rank}, {self.method}) ---\n{tb}"

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            type(self),
            (self.rank, self.method, self.remote_traceback, self.exc_type, self.exc_message),
        )


class WorkerDiedError(DispatchError, RuntimeError):
    """A worker is gone (process exit, kill, lost actor)."""

    def __init__(self, rank: int, detail: str = "", method: str | None = None) -> None:
        self.rank = rank
        self.detail = detail
        self.method = method
        #: Set when another rank saw ``rank`` dead (reading rows it kept for a lazy result): that
        #: rank, which may be in another group, is the one gone, not a rank of the call that raised.
        self.seen_by: int | None = None
        super().__init__(rank, detail, method)

    def __str__(self) -> str:
        msg = f"worker rank {self.rank} died"
        if self.method:
            msg += f" while running {self.method!r}"
        if self.detail:
            msg += f": {self.detail}"
        return msg

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.rank, self.detail, self.method))


class MemoryBudgetError(DispatchError, MemoryError):
    """A rank would hold more rows of lazy results than its budget (``lazy_budget_bytes``)."""


class DispatchTimeoutError(DispatchError, TimeoutError):
    """A call did not finish within its timeout.

    ``method`` and ``ranks`` (the ranks still running) are set when known.
    """

    def __init__(self, message: str = "", *, method: str | None = None, ranks: tuple[int, ...] = ()) -> None:
        super().__init__(message)
        self.method = method
        self.ranks = tuple(ranks)

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (_timeout_error, (str(self), self.method, self.ranks))


class CallCancelledError(DispatchError, concurrent.futures.CancelledError):
    """A call was cancelled (``future.cancel()``, a stream left early, a timeout with ``on_timeout="cancel"``).

    ``method`` and ``ranks`` (the ranks that had not finished when it was
    cancelled) are set when known.  It is also a
    ``concurrent.futures.CancelledError``, what ``Future.result()`` raises
    after a cancel.
    """

    def __init__(self, message: str = "", *, method: str | None = None, ranks: tuple[int, ...] = ()) -> None:
        super().__init__(message)
        self.method = method
        self.ranks = tuple(ranks)

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (_cancelled_error, (str(self), self.method, self.ranks))


class CallInterrupted(BaseException):  # noqa: N818 - raised into a worker's thread, like KeyboardInterrupt
    """Raised inside a worker method whose call was cancelled (at its next Python instruction).

    A ``BaseException``, as ``KeyboardInterrupt`` and ``asyncio.CancelledError``
    are, so that a worker's ``except Exception`` does not swallow it.  Catch it
    only to clean up, then re-raise.
    """


def _unpicklable_error(message: str, where: str, method: str | None, in_process: bool) -> UnpicklableError:
    return UnpicklableError(message, where=where, method=method, in_process=in_process)


def _cancelled_error(message: str, method: str | None, ranks: tuple[int, ...]) -> CallCancelledError:
    return CallCancelledError(message, method=method, ranks=ranks)


def _timeout_error(message: str, method: str | None, ranks: tuple[int, ...]) -> DispatchTimeoutError:
    return DispatchTimeoutError(message, method=method, ranks=ranks)
