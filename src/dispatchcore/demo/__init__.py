"""``dispatchcore demo``: a small but real RL post-training loop on any backend.

A tiny digit policy learns a checkable task (shift every prompt digit by 3)
with the verl loop: generate, reward, reference log-probs, group-baseline
advantages, data-parallel update.  Run ``dispatchcore demo --backend local``
(or ``ray``; ``torchrun`` under ``torchrun -m dispatchcore.demo``).
"""

from .loop import DemoConfig, StepMetrics, run_demo

__all__ = ["DemoConfig", "StepMetrics", "run_demo"]
