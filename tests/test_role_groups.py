"""``wg.role(name, cls)``: a colocated group's role as a ``WorkerGroup[cls]``, checked at run time.

The typing side (mypy and pyright read ``WorkerGroup[Actor]`` off the call)
is in ``tests/typing/typed_driver.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from dispatchcore import (
    Dispatch,
    DispatchError,
    Worker,
    WorkerGroup,
    create_colocated_worker_cls,
    create_colocated_worker_raw_cls,
    register,
)


class Actor(Worker):
    def __init__(self, lr: float = 0.1) -> None:
        super().__init__()
        self.lr = lr

    @register(Dispatch.ONE_TO_ALL)
    def rate(self) -> float:
        return self.lr


class FastActor(Actor):
    pass


class Critic(Worker):
    @register(Dispatch.ONE_TO_ALL)
    def score(self, value: int) -> int:
        return value * 2


@pytest.fixture(scope="module")
def wg() -> Iterator[WorkerGroup[Any]]:
    cls = create_colocated_worker_cls({"actor": FastActor, "critic": Critic})
    group: WorkerGroup[Any] = WorkerGroup(cls, 2, init_kwargs={"actor": {"lr": 0.5}})
    yield group
    group.shutdown()


def test_a_role_is_spawns_view_of_that_role(wg: WorkerGroup[Any]) -> None:
    actor = wg.role("actor", FastActor)
    assert actor.worker_cls is FastActor and actor.role_prefix == "actor_"
    assert actor.rate() == [0.5, 0.5] and actor.call.rate() == [0.5, 0.5]
    assert wg.role("critic", Critic).call.score(3) == [6, 6]
    assert actor.rank_ids == wg.rank_ids


def test_a_base_class_of_the_role_is_accepted(wg: WorkerGroup[Any]) -> None:
    assert wg.role("actor", Actor).rate() == [0.5, 0.5]
    assert wg.role("actor", Worker).worker_cls is FastActor


@pytest.mark.parametrize(
    ("name", "cls", "error", "says"),
    [
        ("actor", Critic, DispatchError, r"role 'actor' of Colocated_actor_critic hosts FastActor, not Critic"),
        ("critic", "Critic", DispatchError, r"needs the role's worker class"),
        ("ref", Actor, KeyError, r"'ref'"),  # spawn's error
    ],
)
def test_a_wrong_role_or_class_is_refused(wg: WorkerGroup[Any], name: str, cls: Any, error: type, says: str) -> None:
    with pytest.raises(error, match=says):
        wg.role(name, cls)


def test_a_group_of_one_role_has_no_roles() -> None:
    with WorkerGroup(Critic, 1) as wg, pytest.raises(DispatchError, match="create_colocated_worker_cls"):
        wg.role("critic", Critic)


def test_fused_classes_offer_their_roles_too() -> None:
    class Hybrid(create_colocated_worker_raw_cls({"actor": Actor, "critic": Critic})):
        pass

    with WorkerGroup(Hybrid, 2) as wg:
        assert wg.role("critic", Critic).score(value=1) == [2, 2]
        assert wg.role("actor", Actor).rate() == [0.1, 0.1]
