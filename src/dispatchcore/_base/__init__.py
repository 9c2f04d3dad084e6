"""The floor every layer stands on: the exception tree, did-you-mean hints, the one-shot latch, backend option checks,
old module paths.  Imports nothing of dispatchcore.
"""

from ._errors import (
    BackendNotFoundError,
    BatchSizeError,
    CallCancelledError,
    CallInterrupted,
    CallSignatureError,
    DispatchAttributeError,
    DispatchError,
    DispatchImportError,
    DispatchIndexError,
    DispatchKeyError,
    DispatchRuntimeError,
    DispatchTimeoutError,
    DispatchTypeError,
    DispatchValueError,
    MemoryBudgetError,
    RegistrationError,
    UnpicklableError,
    WorkerDiedError,
    WorkerError,
)
from ._hints import did_you_mean
from ._latch import Latch
from ._options import check_options

__all__ = [
    "BackendNotFoundError",
    "BatchSizeError",
    "CallCancelledError",
    "CallInterrupted",
    "CallSignatureError",
    "DispatchAttributeError",
    "DispatchError",
    "DispatchImportError",
    "DispatchIndexError",
    "DispatchKeyError",
    "DispatchRuntimeError",
    "DispatchTimeoutError",
    "DispatchTypeError",
    "DispatchValueError",
    "Latch",
    "MemoryBudgetError",
    "RegistrationError",
    "UnpicklableError",
    "WorkerDiedError",
    "WorkerError",
    "check_options",
    "did_you_mean",
]
