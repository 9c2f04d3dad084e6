"""A replaced rank takes a live replica's trained state (``replica_state``), or is named reset.

Three data-parallel ranks train (their weights leave setup's), rank 1 is
SIGKILLed and replaced: every rank's checksum then matches and the
survivors are the same processes.  A worker without a hand-over is
named in ``MembershipChange.reset`` and in the error's notes.  local
threads cannot be replaced (``test_replace_rank``); there the hand-over
itself runs between live ranks.
"""

from __future__ import annotations

import os
import signal
from typing import Any

import cloudpickle
import pytest

from dispatchcore import WeightOfferError, WorkerDiedError, WorkerError, WorkerGroup, create_colocated_worker_cls
from dispatchcore._group._heal import heal_from_replica, sources

from . import _heal_workers
from ._heal_workers import Healing, TensorParallel, Trainer, UnmarkedShards

# The ranks import nothing from tests/: the worker classes travel by value.
cloudpickle.register_pickle_by_value(_heal_workers)


def checksums(wg: WorkerGroup[Any]) -> list[tuple[float, int, Any]]:
    return [(total, steps, version) for total, steps, _, version in wg.checksum()]


def pids(wg: WorkerGroup[Any]) -> list[int]:
    return [pid for *_, pid, _ in wg.checksum()]


def test_the_hand_over_between_live_ranks_and_who_gives() -> None:
    """local: rank 1 diverged; rank 0's state goes to it rank to rank.  A mesh's replica is its peer's place.

    Sharded state offered as if replicated is refused before anything moves.
    """
    with WorkerGroup(Healing, 3, backend="local") as wg:
        wg.init_model(0)
        wg.train(3)
        wg.set_version(7)
        wg[1].train(2)
        wg[1].set_version(9)
        assert checksums(wg)[1] != checksums(wg)[0]
        assert heal_from_replica(wg, [1], 0)
        assert checksums(wg) == [checksums(wg)[0]] * 3 and checksums(wg)[0][2] == 7
        assert sources(wg, (1, 2)) == {1: 0, 2: 0} and sources(wg, (0, 1, 2)) == {}
    with WorkerGroup(Trainer, 2, backend="local") as wg:
        wg.init_model(0)
        assert not heal_from_replica(wg, [1], 0)  # no hand-over defined: nothing moves
    with WorkerGroup(TensorParallel, 6, backend="local") as wg:
        wg.init_model(0)
        assert sources(wg, (1,)) == {1: 3} and sources(wg, (0, 2)) == {0: 4, 2: 4}
        assert sources(wg, (1, 3, 5)) == {}
    with WorkerGroup(UnmarkedShards, 2, backend="local") as wg:
        wg.init_model(0)
        with pytest.raises(WeightOfferError, match=r"rows 32\.\.64 of .weight. .* held by no source rank"):
            heal_from_replica(wg, [1], 0)


def test_a_grown_rank_takes_rank_0s_state() -> None:
    """local: ranks added by ``grow`` start from rank 0's trained state, not setup's."""
    with WorkerGroup(Healing, 2, backend="local") as wg:
        wg.init_model(0)
        wg.train(3)
        wg.grow(1)
        assert checksums(wg) == [checksums(wg)[0]] * 3 and checksums(wg)[0][1] == 3


def test_colocated_roles_hand_over_each_roles_state() -> None:
    """local: a colocated class hands over every role that defines a hand-over, each under its role's name."""
    cls = create_colocated_worker_cls({"actor": Healing, "ref": Trainer})
    with WorkerGroup(cls, 2, backend="local") as wg:
        actor, ref = wg.spawn(["actor", "ref"]).values()
        actor.init_model(0)
        ref.init_model(1)
        actor[1].train(2)
        ref[1].train(2)
        ref_before = checksums(ref)
        assert checksums(actor)[1] != checksums(actor)[0]
        assert heal_from_replica(wg, [1], 0)
        assert checksums(actor)[1] == checksums(actor)[0]
        assert checksums(ref) == ref_before  # no hand-over of its own: left as it was


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_ray_replacement_takes_a_replicas_state(ray_session: Any) -> None:
    with WorkerGroup(Healing, 3, backend="ray", death_timeout=5, on_rank_death="replace") as wg:
        wg.init_model(0)
        wg.train(5)
        wg.set_version(3)
        trained, before = checksums(wg)[0], pids(wg)
        os.kill(before[1], signal.SIGKILL)
        assert checksums(wg) == [trained] * 3  # retry=True: replaced, healed, asked again
        after = pids(wg)
        assert after[0::2] == before[0::2] and after[1] != before[1]
        change = wg.replace_rank(0, 1, 2)
        assert change.reset == (0, 1, 2) and checksums(wg)[0][1] == 0  # no live source: setup's state, named
    with WorkerGroup(Trainer, 3, backend="ray", death_timeout=5, on_rank_death="replace") as wg:
        wg.init_model(0)
        wg.train(5)
        os.kill(pids(wg)[1], signal.SIGKILL)
        with pytest.raises(WorkerDiedError) as died:
            wg.checksum_once()
        assert any("rank(s) [1] were replaced and no replica handed them its state" in n for n in died.value.__notes__)
        assert [s for _, s, _ in checksums(wg)] == [5, 0, 5]  # what the note says: rank 1 holds setup's state


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_torchrun_replacement_takes_a_replicas_state() -> None:
    """Self-started torchrun, two spares: rank 1 dies, then rank 1 is stuck past cancel_grace; both times
    the spare taking its place takes rank 0's state."""
    with WorkerGroup(
        Healing, 3, backend="torchrun", death_timeout=5, on_rank_death="replace", spare_ranks=2, cancel_grace=0.5
    ) as wg:
        wg.init_model(0)
        wg.train(5)
        trained, before = checksums(wg)[0], pids(wg)
        os.kill(before[1], signal.SIGKILL)
        assert checksums(wg) == [trained] * 3
        after = pids(wg)
        assert after[0::2] == before[0::2] and after[1] != before[1]
        with pytest.raises(WorkerError, match="the step failed"):
            wg.fail_while_one_hangs(1)  # rank 1 stepped once more and stays in the call
        assert checksums(wg) == [trained] * 3  # the stuck rank was replaced first, and healed
        last = pids(wg)
        assert last[0::2] == before[0::2] and last[1] not in (before[1], after[1])
