"""Workers for the rank-replacement tests (importable by Ray and torchrun ranks)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

from dispatchcore import Dispatch, MembershipChange, Worker, register


class Restartable(Worker):
    """Trivial ``__init__``; records what setup replay and the membership hook did."""

    def __init__(self) -> None:
        self.log: list[Any] = ["init"]

    @register(Dispatch.ONE_TO_ALL)
    def pid(self) -> int:
        return os.getpid()

    @register(Dispatch.ONE_TO_ALL, setup=True)
    def configure(self, value: str) -> None:
        self.log.append(("configure", value))

    @register(Dispatch.ALL_TO_ALL, setup=True)
    def configure_each(self, value: str) -> None:
        self.log.append(("configure_each", value))

    @register(Dispatch.ONE_TO_ALL, retry=True)
    def state(self) -> tuple[int, list[Any], str | None]:
        return self.rank, list(self.log), os.environ.get("MASTER_PORT")

    @register(Dispatch.ONE_TO_ALL)
    def state_once(self) -> tuple[int, list[Any]]:
        """Not retry-safe: under on_rank_death="replace" a death still raises (after the replacement)."""
        return self.rank, list(self.log)

    @register(Dispatch.ONE_TO_ALL)
    def die_while_others_hold(self, dead: int, folder: str) -> int:
        """Rank ``dead`` is SIGKILLed once every other rank is in; those stay, deaf to interrupts, until released.

        They leave when the file ``folder/release`` appears (or after 60 s).
        """
        if self.rank == dead:
            others = [Path(folder, f"in-{r}") for r in range(self.world_size) if r != dead]
            deadline = time.monotonic() + 60.0
            while not all(p.exists() for p in others) and time.monotonic() < deadline:
                time.sleep(0.01)
            os.kill(os.getpid(), signal.SIGKILL)
        Path(folder, f"in-{self.rank}").touch()
        deadline = time.monotonic() + 60.0
        while not Path(folder, "release").exists() and time.monotonic() < deadline:
            try:
                time.sleep(0.05)
            except BaseException:  # noqa: BLE001, S110 - a stuck rank: the cancel's interrupt does not end it
                pass
        return self.rank

    def on_membership_change(self, change: MembershipChange) -> None:
        self.log.append(("change", change.replaced, change.source_rank, change.is_new(self.rank)))
