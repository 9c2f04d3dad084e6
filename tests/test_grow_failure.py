"""A grow that fails removes the ranks it added; the old ranks keep serving (issue 40, item 6).

Each phase fails in turn on ``local``: a new rank's ``__init__``, the setup replay on a new rank, the
resize hook on an old rank, and the weights the new ranks take.  The error names the rank and the
phase; the group then answers from its old ranks at the old size, and grows again once the cause is gone.
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch

from dispatchcore import Dispatch, DispatchError, WeightSync, Worker, WorkerDiedError, WorkerGroup, register


class Trainer(Worker):
    def weights(self) -> dict[str, torch.Tensor]:
        return {"w": torch.ones(2)}


class Fragile(Worker):
    #: Where to fail: {"init": rank, "setup": rank, "hook": rank, "apply": rank}.
    fail: ClassVar[dict[str, int]] = {}

    def __init__(self) -> None:
        if self.rank == self.fail.get("init"):
            raise RuntimeError("init failed on purpose")
        self.sizes: list[int] = []

    @register(Dispatch.ONE_TO_ALL, setup=True)
    def setup(self, seed: int) -> None:
        if self.rank == self.fail.get("setup"):
            raise RuntimeError("setup failed on purpose")
        self.seed = seed

    def on_membership_change(self, change: Any) -> None:
        if self.rank == self.fail.get("hook") and change.added:
            raise RuntimeError("hook failed on purpose")
        self.sizes.append(change.world_size)

    def load_weights(self, named: list[tuple[str, torch.Tensor]]) -> None:
        if self.rank == self.fail.get("apply"):
            raise RuntimeError("apply failed on purpose")

    @register(Dispatch.ONE_TO_ALL)
    def where(self) -> tuple[int, int, int]:
        return self.rank, self.world_size, self.seed


@pytest.fixture
def fragile():
    Fragile.fail = {}
    with WorkerGroup(Fragile, 2, backend="local") as wg:
        wg.setup(5)
        yield wg
    Fragile.fail = {}


@pytest.mark.parametrize(
    ("where", "rank", "phase"),
    [
        ("init", 2, "init failed on purpose"),
        ("setup", 3, "before every rank took the new size (rank 3: WorkerError"),
        ("hook", 0, "before every rank took the new size (rank 0: WorkerError"),
    ],
)
def test_a_failed_grow_leaves_the_old_ranks_serving(fragile, where: str, rank: int, phase: str) -> None:
    Fragile.fail = {where: rank}
    with pytest.raises(Exception) as info:
        fragile.grow(2)
    text = "\n".join([str(info.value), *getattr(info.value, "__notes__", [])])
    assert phase in text
    assert "the group keeps its 2 ranks" in text
    assert fragile.world_size == 2
    assert fragile.where() == [(0, 2, 5), (1, 2, 5)]
    Fragile.fail = {}
    fragile.grow(2)  # the cause gone, the same group grows
    assert fragile.where() == [(r, 4, 5) for r in range(4)]


def test_a_grow_whose_weights_fail_removes_the_new_ranks(fragile) -> None:
    with WorkerGroup(Trainer, 1, backend="local") as trainer:
        sync = WeightSync(trainer, fragile)
        sync(1)
        Fragile.fail = {"apply": 2}
        with pytest.raises(DispatchError, match=r"before the new ranks took their state .*keeps its 2 ranks"):
            fragile.grow(1, sync=sync, version=2)
        assert fragile.where() == [(0, 2, 5), (1, 2, 5)]


def test_shutdown_after_a_failed_grow_is_prompt(fragile) -> None:
    Fragile.fail = {"setup": 2}
    with pytest.raises(DispatchError):
        fragile.grow(1)
    fragile.shutdown()  # returns: nothing of the failed grow is left for it to wait on (timed in benchmarks/resize.py)
    assert not [t for t in threading.enumerate() if t.name.startswith("dispatchcore-Fragile-") and t.is_alive()]


class Victim(Worker):
    """A new rank kills old rank 1 while the group grows (its pid in the file ``victim``): a death mid-grow."""

    def __init__(self, victim: str) -> None:
        if self.world_size > 2 and self.rank == 2:
            os.kill(int(Path(victim).read_text()), signal.SIGKILL)

    @register(Dispatch.ONE_TO_ALL)
    def pid(self) -> int:
        return os.getpid()


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.usefixtures("ray_session")
def test_ray_an_old_rank_dying_mid_grow_is_reported_as_a_death(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    wg = WorkerGroup(Victim, 2, backend="ray", init_args=(str(victim),), death_timeout=10)
    try:
        pids = wg.pid()
        victim.write_text(str(pids[1]))
        with pytest.raises(WorkerDiedError) as info:
            wg.grow(1)
        assert info.value.rank == 1 and "while the group grew" in str(info.value)
        assert wg.world_size == 2
        wg.replace_rank(1)  # a death like any other: replaced, and the group serves again
        after = wg.pid()
        assert after[0] == pids[0] and after[1] != pids[1]
    finally:
        wg.shutdown()


def test_a_view_refused_after_a_shrink_does_not_stop_a_later_grow(fragile) -> None:
    fragile.grow(1)
    stale = fragile.ranks([1, 2])
    fragile.shrink(2)
    fragile.grow(1)  # the refused view names a rank number the new world reuses: it stays refused
    with pytest.raises(DispatchError, match="which shrink removed"):
        stale.where()
    assert fragile.where() == [(0, 3, 5), (1, 3, 5), (2, 3, 5)]


@pytest.mark.timeout(120)
def test_torchrun_an_old_process_dying_while_grow_starts_processes_is_a_death(tmp_path: Path) -> None:
    """Self-started torchrun: old rank 1 killed while grow(2) waits for its new process; the spare replaces it."""
    with WorkerGroup(Victim, 2, backend="torchrun", init_args=(str(tmp_path / "victim"),), spare_ranks=1) as wg:
        pids = wg.pid()
        killer = threading.Timer(0.3, os.kill, (pids[1], signal.SIGKILL))
        killer.start()  # a new process takes seconds to import torch: the grow is still waiting for it
        try:
            with pytest.raises(WorkerDiedError) as info:
                wg.grow(2)
        finally:
            killer.join()
        assert info.value.rank == 1 and "while grow(2) started the new ranks" in str(info.value)
        assert wg.world_size == 2
        wg.replace_rank(1)  # from the spare: the group was never marked broken
        after = wg.pid()
        assert after[0] == pids[0] and after[1] != pids[1]
        (tmp_path / "victim").write_text(str(after[1]))
        with pytest.raises(WorkerDiedError) as info:  # a new rank's __init__ kills rank 1 this time
            wg.grow(1)
        assert info.value.rank == 1 and wg.world_size == 2
