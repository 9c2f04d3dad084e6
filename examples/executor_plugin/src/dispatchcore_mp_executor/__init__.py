"""An example dispatchcore executor: one spawned process per rank on the core's lane.

Install the package and pass ``backend="multiprocess"`` to ``WorkerGroup``.
"""

from __future__ import annotations

from ._executor import MultiprocessExecutor

__all__ = ["MultiprocessExecutor"]
