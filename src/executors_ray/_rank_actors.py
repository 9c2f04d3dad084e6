"""What a Ray group's lane and call handles see of it: its rank actors, not its executor.

The lane's bulk path (``_bulk``) and the rows call handles need a handful of
things from their group: the ``ray`` module and which Ray its references belong to, the
rank actors with their names and nodes (for error messages), a few
settings, whether the group is shut down, and how to mark it broken.
:class:`RankActors` holds exactly those, so neither module imports (or calls
back into) the executor, which imports them.

The executor owns its one :class:`RankActors` and keeps its tables current in
place (a replaced rank's entries are swapped, shutdown empties ``actors``), so
a handle made earlier reads the group as it is now.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(eq=False, kw_only=True, slots=True)
class RankActors:
    """One Ray group's rank actors, where they run, and the facts its calls need (see the module docstring)."""

    #: The ``ray`` module.
    ray: Any
    #: Which Ray this group's references belong to (a new one after ``ray.shutdown()``/``init``).
    job_id: str
    world_size: int
    #: ``GroupSpec.death_timeout``: how long a rank may stay silent before it counts as dead.
    death_timeout: float
    #: ``GroupSpec.isolate``: results are copied out of the object store unless the call copied them already.
    isolate: bool
    #: The backend's cap on the seconds between liveness checks (``None``: the core's).
    poll_interval: float | None
    #: The executor's ``mark_broken``: a call that lost a rank refuses the group's later calls.
    mark_broken: Callable[[str], None]
    #: Each rank's actor name (replacing a rank renames its entry).
    names: list[str]
    #: The actor handles, in rank order (empty once the group let go of them).
    actors: list[Any] = field(default_factory=list)
    #: Each rank's ``describe()`` answer (its node id and ip), once its actor started.
    infos: list[dict[str, Any]] = field(default_factory=list)
    #: Whether the group shut down (its actors are gone, or let go of if detached).
    closed: bool = False

    def actor(self, rank: int) -> Any:
        """Rank ``rank``'s actor handle."""
        return self.actors[rank]

    def actor_name(self, rank: int) -> str:
        """Rank ``rank``'s Ray actor name."""
        return self.names[rank]

    def node_of(self, rank: int) -> str:
        """``node <ip> (<node id prefix>)`` hosting ``rank``, for error messages."""
        info = self.infos[rank] if rank < len(self.infos) else None
        if not info:
            return "an unknown node"
        return f"node {info['ip']} ({str(info['node_id'])[:8]})"
