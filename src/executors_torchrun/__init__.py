"""torchrun executor: ranks as torch.distributed processes (backend ``"torchrun"``).

Under ``torchrun --nproc-per-node=N driver.py`` worker ``i`` is process rank
``i`` (worker 0 on a thread of the driver); outside torchrun the group starts
its ranks itself.  The executor class loads lazily: the plugin entry point
never imports torch.distributed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._child import STACKS_SIGNAL

if TYPE_CHECKING:
    from ._executor import TorchrunExecutor

__all__ = ["STACKS_SIGNAL", "TorchrunExecutor"]


def __getattr__(name: str) -> Any:
    if name == "TorchrunExecutor":
        from ._executor import TorchrunExecutor

        return TorchrunExecutor
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
