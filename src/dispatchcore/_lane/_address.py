"""Where a lane listens and the token that opens it, and how ranks learn both."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class LaneAddress:
    """A door's host, port and token: everything a rank needs to connect, nothing more."""

    host: str
    port: int
    token: bytes

    def encode(self) -> str:
        """``"host port tokenhex"``: a string any store or actor argument can carry."""
        return f"{self.host} {self.port} {self.token.hex()}"

    @classmethod
    def decode(cls, text: str | bytes) -> LaneAddress:
        """The inverse of :meth:`encode`."""
        if isinstance(text, bytes):
            text = text.decode()
        host, port, token = text.split()
        return cls(host, int(port), bytes.fromhex(token))

    def __repr__(self) -> str:  # never print the token: it is the lane's only key
        return f"LaneAddress(host={self.host!r}, port={self.port})"


class LaneDirectory(Protocol):
    """How a lane address reaches the ranks (only ranks that read the directory learn the token)."""

    def publish(self, address: LaneAddress) -> None:
        """Make ``address`` readable by the ranks (the driver calls this once per door)."""
        ...

    def lookup(self) -> LaneAddress:
        """The published address (a rank calls this, waiting as the directory waits)."""
        ...
