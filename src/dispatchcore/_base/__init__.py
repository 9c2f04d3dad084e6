"""The floor every layer stands on: the exception tree, the one-shot latch, backend option checks, old module paths.

Imports nothing of dispatchcore.
"""

from ._errors import (
    BackendNotFoundError,
    BatchSizeError,
    CallCancelledError,
    CallInterrupted,
    DispatchError,
    DispatchTimeoutError,
    MemoryBudgetError,
    RegistrationError,
    UnpicklableError,
    WorkerDiedError,
    WorkerError,
)
from ._latch import Latch
from ._options import check_options

__all__ = [
    "BackendNotFoundError",
    "BatchSizeError",
    "CallCancelledError",
    "CallInterrupted",
    "DispatchError",
    "DispatchTimeoutError",
    "Latch",
    "MemoryBudgetError",
    "RegistrationError",
    "UnpicklableError",
    "WorkerDiedError",
    "WorkerError",
    "check_options",
]
