"""Entry point of the ``torchrun`` backend (group ``dispatchcore``); torch.distributed loads only when the hook runs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dispatchcore import hookimpl


@hookimpl
def dispatchcore_register_executors(register: Callable[[type[Any]], None]) -> None:
    from ._executor import TorchrunExecutor

    register(TorchrunExecutor)
