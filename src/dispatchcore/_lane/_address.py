"""Where a lane listens, and how ranks learn it: an address alone opens nothing (links prove the secret)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from .._base import DispatchValueError


@dataclass(frozen=True)
class LaneAddress:
    """A door's host and port: public, so a store or an actor argument may carry it."""

    host: str
    port: int

    def encode(self) -> str:
        """``"host port"``: a string any store or actor argument can carry."""
        return f"{self.host} {self.port}"

    @classmethod
    def decode(cls, text: str | bytes) -> LaneAddress:
        """The inverse of :meth:`encode`."""
        if isinstance(text, bytes):
            text = text.decode(errors="replace")
        fields = text.split()
        if len(fields) != 2 or not fields[1].isdigit():
            raise DispatchValueError(f"not a lane address (want 'host port'): {text[:80]!r}")
        return cls(fields[0], int(fields[1]))


class LaneDirectory(Protocol):
    """How a lane address reaches the ranks (an address is public: the secret travels apart)."""

    def publish(self, address: LaneAddress) -> None:
        """Make ``address`` readable by the ranks (the driver calls this once per door)."""
        ...

    def lookup(self) -> LaneAddress:
        """The published address (a rank calls this, waiting as the directory waits)."""
        ...
