"""torchrun executor: ranks as torch.distributed processes (backend ``"torchrun"``).

``WorkerGroup(Actor, backend="torchrun")`` under ``torchrun --nproc-per-node=N
driver.py`` puts worker ``i`` on process rank ``i`` (worker 0 on a thread of
the driver); outside torchrun the group starts its ranks itself.  Under the
torchrun launcher only, the driver installs a SIGTERM handler (if SIGTERM
still has its default disposition) so that the agent's SIGTERM after a rank
died ends the driver with a ``WorkerDiedError`` naming that rank (see
``_worlds``).

The executor class loads lazily, so importing the plugin entry point
(``executors_torchrun.plugin``) never imports torch.distributed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._executor import TorchrunExecutor

__all__ = ["TorchrunExecutor"]


def __getattr__(name: str) -> Any:
    if name == "TorchrunExecutor":
        from ._executor import TorchrunExecutor

        return TorchrunExecutor
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
