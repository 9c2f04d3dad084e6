"""A typed driver, checked by mypy and pyright in ``test_type_checkers.py`` (never run).

Correct calls carry ``assert_type``; each line a checker must reject ends in
``# expect: mypy=<error code> pyright=<rule>``, and the test compares every
checker's output with exactly those lines.
"""

# ruff: noqa: F841, B018 - the wrong lines assign and read only to be type-checked

from __future__ import annotations

import asyncio
from typing import Any, assert_type

from dispatchcore import (
    CallFuture,
    DataProto,
    DataProtoFuture,
    Dispatch,
    Execute,
    Worker,
    WorkerGroup,
    create_colocated_worker_cls,
    make_nd_compute_dataproto_dispatch_fn,
    register,
    register_dispatch_mode,
)


def one_each(wg: Any, *args: Any, **kwargs: Any) -> tuple[tuple[list[Any], ...], dict[str, list[Any]]]:
    return tuple(list(a) for a in args), {k: list(v) for k, v in kwargs.items()}


def collect_total(wg: Any, outputs: list[int]) -> int:
    return sum(outputs)


def collect_unannotated(wg, outputs):
    return outputs


TOTAL = register_dispatch_mode("TYPED_TOTAL", one_each, collect_total)
LOOSE = register_dispatch_mode("TYPED_LOOSE", one_each, collect_unannotated)
MESH = make_nd_compute_dataproto_dispatch_fn("train")


class Actor(Worker):
    @register(Dispatch.ONE_TO_ALL)
    def init_model(self, lr: float, *, seed: int = 0) -> None: ...

    @register(Dispatch.DP_COMPUTE_PROTO)
    def update_actor(self, data: DataProto) -> DataProto:
        assert_type(self.losses(), float)  # on the worker: the plain method
        return data

    @register(Dispatch.DP_COMPUTE_PROTO, blocking=False)
    def update_later(self, data: DataProto) -> DataProto:
        return data

    @register(Dispatch.DP_COMPUTE_PROTO_WITH_FUNC)
    def apply(self, fn: Any, data: DataProto) -> DataProto:
        return data

    @register(Dispatch.ONE_TO_ALL)
    def losses(self) -> float:
        return 0.0

    @register(Dispatch.RANK_ZERO)
    def save(self, path: str) -> str:
        return path

    @register(Dispatch.ONE_TO_ALL, execute_mode=Execute.RANK_ZERO)
    def count_on_zero(self) -> int:
        return 0

    @register(Dispatch.DP_COMPUTE_METRIC)
    def metrics(self, data: DataProto) -> dict[str, float]:
        return {}

    @register(Dispatch.DP_COMPUTE)
    def scatter(self, part: int) -> int:
        return part

    @register(Dispatch.ONE_TO_ALL, blocking=False)
    def sleep_later(self, seconds: float) -> int:
        return 0

    @register(Dispatch.ONE_TO_ALL)
    async def async_step(self, n: int) -> int:
        return n

    @register
    def bare(self, x: int) -> int:
        return x

    @register()
    def defaults(self) -> str:
        return ""

    @register(TOTAL)
    def total(self, part: int) -> int:
        return part

    @register(LOOSE)
    def loose(self) -> int:
        return 0

    @register(MESH)
    def nd_update(self, data: DataProto) -> DataProto:
        return data

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def by_keyword(self, data: DataProto) -> DataProto:
        return data

    @register(Dispatch.ONE_TO_ALL, Execute.ALL)
    def verl_positional(self, step: int) -> bool:
        return True

    @register(Dispatch.DP_COMPUTE_PROTO, Execute.RANK_ZERO, blocking=False)
    def zero_later(self, data: DataProto) -> DataProto:
        return data

    def helper(self) -> int:
        return 0


class Critic(Worker):
    @register(Dispatch.DP_COMPUTE_PROTO)
    def compute_values(self, data: DataProto) -> DataProto:
        return data

    @register(Dispatch.ONE_TO_ALL)
    def init_model(self, lr: float) -> None: ...


def correct(wg: WorkerGroup[Actor], batch: DataProto) -> None:
    assert_type(WorkerGroup(Actor, 2), WorkerGroup[Actor])
    assert_type(wg.call.init_model(1e-3), list[None])
    assert_type(wg.call.init_model(lr=1e-3, seed=1), list[None])
    assert_type(wg.call.update_actor(batch), DataProto)
    assert_type(wg.call.update_actor.options(timeout=5)(batch), DataProto)
    assert_type(wg.call.update_actor.options(on_timeout="cancel", timeout=5)(batch), DataProto)
    assert_type(wg.call.update_actor.options(blocking=False)(batch), Any)  # a future: which one, the mode decides
    assert_type(wg.call.update_later(batch), DataProtoFuture)
    assert_type(wg.call.update_later(batch).get(), DataProto)
    assert_type(wg.call.apply(lambda d: d, batch), DataProto)
    assert_type(wg.call.losses(), list[float])
    assert_type(wg.call.save("ckpt.pt"), str)
    assert_type(wg.call.count_on_zero(), int)
    assert_type(wg.call.metrics(batch), list[dict[str, float]])
    assert_type(wg.call.scatter([1, 2]), list[int])  # per-rank lists: arguments unchecked
    assert_type(wg.call.sleep_later(0.1), CallFuture[list[int]])
    assert_type(wg.call.async_step(1), list[int])
    assert_type(wg.call.bare(1), list[int])
    assert_type(wg.call.defaults(), list[str])
    assert_type(wg.call.total(1), int)
    assert_type(wg.call.loose(), Any)
    assert_type(wg.call.nd_update(batch), DataProto)
    assert_type(wg.call.by_keyword(batch), DataProto)
    assert_type(wg.call.verl_positional(3), list[bool])
    assert_type(wg.call.zero_later(batch), CallFuture[DataProto])
    # Views are groups of the same worker class.
    assert_type(wg[0:2], WorkerGroup[Actor])
    assert_type(wg.ranks([0, 3]).call.update_actor(batch), DataProto)
    # verl-style calls stay accepted, unchecked.
    wg.update_actor(batch)


def correct_roles(batch: DataProto) -> None:
    # A colocated group's roles, typed by the class each one hosts.
    fused = WorkerGroup(create_colocated_worker_cls({"actor": Actor, "critic": Critic}), 2)
    assert_type(fused.role("actor", Actor), WorkerGroup[Actor])
    assert_type(fused.role("actor", Actor).call.update_actor(batch), DataProto)
    assert_type(fused.role("critic", Critic).call.compute_values(batch), DataProto)
    assert_type(fused.role("critic", Critic).call.init_model(lr=1e-3), list[None])
    assert_type(fused.role("actor", Worker), WorkerGroup[Worker])  # a base class: fewer methods known
    # spawn's dict stays untyped: its views accept anything.
    fused.spawn({"actor"})["actor"].call.no_such_method()


async def correct_async(wg: WorkerGroup[Actor], batch: DataProto) -> None:
    assert_type(await wg.call.update_later(batch), DataProto)
    out, ranks = await asyncio.gather(wg.call.update_later(batch), wg.call.sleep_later(0.1))
    assert_type(out, DataProto)
    assert_type(ranks, list[int])


def wrong(wg: WorkerGroup[Actor], batch: DataProto) -> None:
    wg.call.update_actor(3)  # expect: mypy=arg-type pyright=reportArgumentType
    wg.call.update_actor(batch, batch)  # expect: mypy=call-arg pyright=reportCallIssue
    wg.call.init_model()  # expect: mypy=call-arg pyright=reportCallIssue
    wg.call.init_model(1e-3, momentum=0.9)  # expect: mypy=call-arg pyright=reportCallIssue
    wg.call.init_model.options(timout=5)  # expect: mypy=call-overload pyright=reportCallIssue
    wg.call.init_model("fast")  # expect: mypy=arg-type pyright=reportArgumentType
    wg.call.update_actr(batch)  # expect: mypy=attr-defined pyright=reportAttributeAccessIssue
    wg.ranks([0, 1]).call.sav("p")  # expect: mypy=attr-defined pyright=reportAttributeAccessIssue
    as_list: list[DataProto] = wg.call.update_actor(batch)  # expect: mypy=assignment pyright=reportAssignmentType
    one_loss: float = wg.call.losses()  # expect: mypy=assignment pyright=reportAssignmentType
    saved: list[str] = wg.call.save("p")  # expect: mypy=assignment pyright=reportAssignmentType
    counted: list[int] = wg.call.count_on_zero()  # expect: mypy=assignment pyright=reportAssignmentType
    metric: DataProto = wg.call.metrics(batch)  # expect: mypy=assignment pyright=reportAssignmentType
    total: str = wg.call.total(1)  # expect: mypy=assignment pyright=reportAssignmentType
    nd: list[DataProto] = wg.call.nd_update(batch)  # expect: mypy=assignment pyright=reportAssignmentType
    wg.call.update_later(batch).batch  # expect: mypy=attr-defined pyright=reportAttributeAccessIssue
    later: list[int] = wg.call.sleep_later(0.1)  # expect: mypy=assignment pyright=reportAssignmentType
    wg.call.helper()  # expect: mypy=call-arg pyright=reportCallIssue


def wrong_roles(fused: WorkerGroup[Worker], batch: DataProto) -> None:
    critic = fused.role("critic", Critic)
    critic.call.compute_values(3)  # expect: mypy=arg-type pyright=reportArgumentType
    critic.call.update_actor(batch)  # expect: mypy=attr-defined pyright=reportAttributeAccessIssue
    values: list[DataProto] = critic.call.compute_values(batch)  # expect: mypy=assignment pyright=reportAssignmentType
    fused.role("actor", Actor).call.init_model()  # expect: mypy=call-arg pyright=reportCallIssue
    fused.role("actor", Actor).call.savee("p")  # expect: mypy=attr-defined pyright=reportAttributeAccessIssue
    fused.role("actor", "Actor")  # expect: mypy=arg-type pyright=reportArgumentType


async def wrong_async(wg: WorkerGroup[Actor], batch: DataProto) -> None:
    await wg.call.update_actor(batch)  # expect: mypy=misc pyright=reportGeneralTypeIssues
    steps: list[str] = await wg.call.sleep_later(0.1)  # expect: mypy=assignment pyright=reportAssignmentType
