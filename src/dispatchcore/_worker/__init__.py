"""The rank side of a group: the worker base class, mesh declarations, colocation, rejoin.

The face re-exports the worker module's names, which were
``dispatchcore._worker``'s before the core became packages.
"""

from ._rank_context import rank_context
from ._worker import Worker

__all__ = ["Worker", "rank_context"]
