"""In-process executor: every rank is a worker object served by its own thread."""

from ._executor import LocalExecutor

__all__ = ["LocalExecutor"]
