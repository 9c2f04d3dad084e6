"""What a Ray group's lane and call handles see of it (kept current in place by the executor), not the executor."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(eq=False, kw_only=True, slots=True)
class RankActors:
    """One Ray group's rank actors, where they run, and the facts its calls need (see the module docstring)."""

    #: The ``ray`` module, and which Ray this group's references belong to.
    ray: Any
    job_id: str
    #: The group's ``GroupSpec.death_timeout`` and ``isolate``.
    death_timeout: float
    isolate: bool
    #: The executor's ``mark_broken``: a call that lost a rank refuses the group's later calls.
    mark_broken: Callable[[str], None]
    #: Each rank's actor name and handle (empty once the group let go of them), in rank order.
    names: list[str]
    actors: list[Any] = field(default_factory=list)
    #: Each rank's ``describe()`` answer (its node id and ip), once its actor started.
    infos: list[dict[str, Any]] = field(default_factory=list)
    closed: bool = False

    def node_of(self, rank: int) -> str:
        """``node <ip> (<node id prefix>)`` hosting ``rank``, for error messages."""
        info = self.infos[rank] if rank < len(self.infos) else None
        if not info:
            return "an unknown node"
        return f"node {info['ip']} ({str(info['node_id'])[:8]})"

    def gone(self, rank: int, exc: BaseException) -> str:
        """Why rank ``rank`` counts as dead, from the error Ray raised for its actor."""
        name, node = self.names[rank], self.node_of(rank)
        return f"its Ray actor {name!r} on {node} is gone ({type(exc).__name__}: {first_line(exc)})"


def first_line(exc: BaseException) -> str:
    """The first line of an error's text (Ray's run to many), cut at 300 characters."""
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else ""
