"""The one exception tree of dispatchcore.

Every exception raised on purpose by the library derives from
:class:`DispatchError` and also from the builtin it most resembles, so a
caller can catch either (``tests/test_error_tree.py`` scans the source for a
bare builtin ``raise`` and lists the few allowed, each with its reason)::

    DispatchError (Exception)
    ├── RegistrationError (ValueError)      bad @register / dispatch-mode input
    ├── BatchSizeError (ValueError)         a batch that cannot be split as asked
    ├── BackendNotFoundError (LookupError)  unknown backend (with a did-you-mean) or missing extra
    ├── CallSignatureError (TypeError)      a call's arguments do not fit the worker method
    ├── DispatchValueError (ValueError)     a bad value: world_size=0, a timeout <= 0, a rank named twice
    ├── DispatchTypeError (TypeError)       a wrong type or an unknown option name
    │   └── UnpicklableError                a value the ranks need cannot be pickled (nothing was sent)
    ├── DispatchKeyError (KeyError)         an unknown role of a colocated group
    ├── DispatchIndexError (IndexError)     a rank out of range in wg[i] / wg.ranks([...])
    ├── DispatchAttributeError (AttributeError)  no such method on a group (with a did-you-mean),
    │                                       or one not decorated with @register
    ├── DispatchRuntimeError (RuntimeError) a state the library cannot go on from (weights that never arrived)
    ├── DispatchImportError (ImportError)   an optional dependency a feature needs is missing (with the pip line)
    ├── WorkerError (RuntimeError)          a worker method raised
    ├── WorkerDiedError (RuntimeError)      a worker process/actor/thread is gone
    ├── MemoryBudgetError (MemoryError)     a rank would keep more lazy rows than its budget
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


class CallSignatureError(DispatchError, TypeError):
    """A call's arguments, as a rank would receive them, do not fit the worker method's signature.

    Raised before anything is sent; ``method`` is ``"<class>.<method>"``, ``parameter`` the one at fault.
    """

    method: str | None = None
    parameter: str | None = None


class DispatchValueError(DispatchError, ValueError):
    """An argument or option has a bad value (``world_size=0``, ``call_timeout=-1``, ``wg.ranks([9])``)."""


class DispatchTypeError(DispatchError, TypeError):
    """An argument or option has the wrong type, or a backend option's name is unknown."""


class DispatchKeyError(DispatchError, KeyError):
    """A name looked up in a table that does not hold it (a colocated group's role)."""

    def __str__(self) -> str:
        return str(self.args[0]) if len(self.args) == 1 else super().__str__()  # no KeyError repr quotes


class DispatchIndexError(DispatchError, IndexError):
    """A position out of range (``wg[7]`` on a group of four)."""


class DispatchAttributeError(DispatchError, AttributeError):
    """A group has no such method (nearest suggested), or it lacks ``@register``; ``hasattr`` still works."""


class DispatchRuntimeError(DispatchError, RuntimeError):
    """The library reached a state it cannot go on from (a transfer whose weights never all arrived)."""


class DispatchImportError(DispatchError, ImportError):
    """A feature needs an optional dependency that is not installed; the message names the ``pip install`` line."""


class UnpicklableError(DispatchTypeError):
    """A worker class, init argument or call argument cannot be pickled for the ranks; nothing was sent.

    ``where`` is the path to the object at fault (``argument 'cfg' → cfg['callback']``); ``in_process``:
    pickled for isolation inside this process (``local``), where code is shared, not pickled.
    """

    def __init__(self, message: str, *, where: str = "", method: str | None = None, in_process: bool = False) -> None:
        super().__init__(message)
        self.where = where
        self.method = method
        self.in_process = in_process

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            _rebuild,
            (type(self), str(self), {"where": self.where, "method": self.method, "in_process": self.in_process}),
        )


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
        head = f"worker rank {self.rank} raised {self.exc_type}: {self.exc_message} (in method {self.method!r})"
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


class _CallEnded(DispatchError):
    """An error about one call: ``method`` and ``ranks`` (the ranks not finished) when known, kept through pickling."""

    def __init__(self, message: str = "", *, method: str | None = None, ranks: tuple[int, ...] = ()) -> None:
        super().__init__(message)
        self.method = method
        self.ranks = tuple(ranks)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), str(self), {"method": self.method, "ranks": self.ranks}))


class DispatchTimeoutError(_CallEnded, TimeoutError):
    """A call did not finish within its timeout (``method`` and ``ranks``, the ranks still running, when known)."""


class CallCancelledError(_CallEnded, concurrent.futures.CancelledError):
    """A call was cancelled (``future.cancel()``, a stream left early, a timeout with ``on_timeout="cancel"``).

    ``method`` and ``ranks`` (the ranks not finished) are set when known; also
    a ``concurrent.futures.CancelledError``, what ``Future.result()`` raises after a cancel.
    """


class CallInterrupted(BaseException):  # noqa: N818 - raised into a worker's thread, like KeyboardInterrupt
    """Raised inside a worker method whose call was cancelled (at its next Python instruction).

    A ``BaseException``, so ``except Exception`` does not swallow it; catch it only to clean up, then re-raise.
    """


def _rebuild(cls: type[BaseException], message: str, fields: dict[str, Any]) -> BaseException:
    """Unpickle an error whose fields are keyword-only arguments."""
    return cls(message, **fields)
