"""One batch of a rollout stream: where its rows are, which weights made them, what became of it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class RolloutBatch:
    """A generate call's result on one rollout rank: rows kept there (``data`` is lazy), plus its versions.

    ``version`` is the rank's weight version when the call began (the oldest
    its rows used), ``newest`` the one it held at the end; ``seq`` is the
    admission order (0, 1, ...), ``attempt`` how many earlier tries of the same
    prompts were lost or evicted; ``submitted`` and ``finished`` are wall-clock seconds.
    """

    seq: int
    rank: int
    prompts: Any
    data: Any = None
    version: int = 0
    newest: int = 0
    attempt: int = 0
    submitted: float = 0.0
    finished: float = 0.0

    def staleness(self, trainer_version: int) -> int:
        """How many trainer versions behind the oldest weights that made these rows are."""
        return int(trainer_version) - int(self.version)


@dataclass(frozen=True)
class LostBatch:
    """A batch a rollout rank failed to make (it raised, died or was cancelled); ``regenerated`` when requeued."""

    seq: int
    rank: int
    error: BaseException
    regenerated: bool


@dataclass(frozen=True)
class Evicted:
    """A finished batch a policy threw away at take time (too stale); ``regenerated`` when its prompts were requeued."""

    seq: int
    rank: int
    version: int
    trainer_version: int
    regenerated: bool


@dataclass
class TakenStep:
    """What :meth:`RolloutStream.take` hands the trainer: the batches, their rows as one lazy ``DataProto``."""

    batches: list[RolloutBatch]
    data: Any
    trainer_version: int
    staleness: list[int] = field(default_factory=list)
