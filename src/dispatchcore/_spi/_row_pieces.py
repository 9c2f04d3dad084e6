"""The plain records a forwarding plan is made of (the planning is ``_forward_plan``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ResultShape:
    """What the core needs to know of one rank's ``DataProto`` result."""

    rows: int
    meta_info: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RowPiece:
    """Rows ``[start, stop)`` of the result at call position ``source``."""

    source: int
    start: int
    stop: int

    def __len__(self) -> int:
        return self.stop - self.start


@dataclass
class ChunkPlan:
    """One consuming rank's chunk: pieces in order, joined, with this ``meta_info``."""

    pieces: list[RowPiece]
    meta_info: dict[str, Any]

    @property
    def rows(self) -> int:
        return sum(len(p) for p in self.pieces)

    @property
    def sources(self) -> list[int]:
        """Call positions this chunk reads from, each once, ascending."""
        return sorted({p.source for p in self.pieces})


@dataclass
class ForwardPlan:
    """Chunks for every consuming rank, and the padding they add."""

    chunks: list[ChunkPlan]
    pad_size: int
    padded_len: int
