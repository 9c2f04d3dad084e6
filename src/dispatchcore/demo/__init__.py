"""``dispatchcore demo``: a small but real RL post-training loop on any backend (see ``demo.loop``).

Run ``dispatchcore demo --backend local`` (or ``ray``; ``torchrun`` under ``torchrun -m dispatchcore.demo``).
"""

from .loop import DemoConfig, StepMetrics, run_demo

__all__ = ["DemoConfig", "StepMetrics", "run_demo"]
