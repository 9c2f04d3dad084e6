"""Calls are bound against the worker method's signature on the driver, as each rank will receive them.

A wrong count or a misspelled keyword raises :class:`CallSignatureError`
(a ``DispatchError`` and a ``TypeError``) naming the method and the
parameter, and nothing reaches any rank (the ``faulty`` wrapper counts what
does).  User modes that add or drop arguments are judged after dispatch.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from dispatchcore import (
    CallSignatureError,
    DataProto,
    Dispatch,
    DispatchError,
    Worker,
    WorkerError,
    WorkerGroup,
    create_colocated_worker_cls,
    make_nd_compute_dataproto_dispatch_fn,
    register,
    register_dispatch_mode,
    unregister_dispatch_mode,
)
from dispatchcore.testing import FaultyExecutor


def _with_rank(wg: Any, *args: Any, **kwargs: Any) -> Any:
    """A user mode that adds an argument: each rank also gets its position."""
    n = wg.world_size
    return (*([a] * n for a in args), list(range(n))), {k: [v] * n for k, v in kwargs.items()}


def _without_debug(wg: Any, *args: Any, **kwargs: Any) -> Any:
    """A user mode that drops an argument: the driver's ``debug=`` never reaches the ranks."""
    kwargs.pop("debug", None)
    n = wg.world_size
    return tuple([a] * n for a in args), {k: [v] * n for k, v in kwargs.items()}


def _per_rank_list(wg: Any, outputs: list[Any]) -> list[Any]:
    return outputs


WITH_RANK = register_dispatch_mode("BIND_WITH_RANK", _with_rank, _per_rank_list)
WITHOUT_DEBUG = register_dispatch_mode("BIND_WITHOUT_DEBUG", _without_debug, _per_rank_list)


def _unreadable(self: Any, x: Any) -> Any:
    return x


_unreadable.__signature__ = "not a signature"  # type: ignore[attr-defined]


class Bound(Worker):
    @register(Dispatch.ONE_TO_ALL)
    def init_model(self, lr: float, *, seed: int = 0) -> float:
        return lr + seed

    @register(Dispatch.DP_COMPUTE_PROTO)
    def update(self, data: DataProto) -> DataProto:
        return data

    @register(Dispatch.ONE_TO_ALL, blocking=False)
    def later(self, x: int) -> int:
        return x

    @register(Dispatch.ONE_TO_ALL)
    def anything(self, *args: Any, **kwargs: Any) -> int:
        return len(args) + len(kwargs)

    @register(WITH_RANK)
    def ranked(self, x: int, rank: int) -> tuple[int, int]:
        return x, rank

    @register(WITHOUT_DEBUG)
    def quiet(self, x: int) -> int:
        return x

    @register(Dispatch.ONE_TO_ALL)
    @staticmethod
    def static(x: int) -> int:
        return x

    unreadable = register(Dispatch.ONE_TO_ALL)(_unreadable)

    def plain(self, x: int) -> int:
        return x


class Critic(Worker):
    @register(Dispatch.ONE_TO_ALL)
    def score(self, value: int) -> int:
        return value


@pytest.fixture(scope="module")
def wg() -> Iterator[WorkerGroup[Bound]]:
    group = WorkerGroup(Bound, 2, backend="faulty", inner="local")
    yield group
    group.shutdown()


def _sent(wg: WorkerGroup[Any], method: str) -> int:
    faulty = FaultyExecutor.of(wg)
    return sum(faulty.calls(method, rank) for rank in range(wg.world_size))


WRONG_CALLS = [
    pytest.param(lambda g: g.init_model(), "init_model", "lr", "missing a required argument", id="missing"),
    pytest.param(lambda g: g.init_model(1.0, 2), "init_model", None, "too many positional", id="extra positional"),
    pytest.param(lambda g: g.init_model(1.0, sed=3), "init_model", "sed", "did you mean 'seed'", id="misspelled"),
    pytest.param(lambda g: g.init_model(1.0, lr=2.0), "init_model", "lr", "multiple values", id="twice"),
    pytest.param(lambda g: g.update(data=_batch(), extra=1), "update", "extra", "unexpected keyword", id="dp mode"),
    pytest.param(lambda g: g.later(), "later", "x", "missing", id="blocking=False"),
    pytest.param(lambda g: g.static(1, 2), "static", None, "too many positional", id="staticmethod"),
    pytest.param(lambda g: g.ranked(1, 2), "ranked", None, "too many positional", id="mode adds an argument"),
    pytest.param(lambda g: g.execute_all("plain"), "plain", "x", "missing", id="execute_all by name"),
    pytest.param(lambda g: g.execute_rank_zero("plain", 1, y=1), "plain", "y", "unexpected", id="execute_rank_zero"),
]


def _batch(n: int = 4) -> DataProto:
    return DataProto.from_dict({"x": torch.arange(n)})


@pytest.mark.parametrize(("call", "method", "parameter", "says"), WRONG_CALLS)
def test_a_call_that_does_not_fit_is_refused_before_it_is_sent(
    wg: WorkerGroup[Bound], call: Any, method: str, parameter: str | None, says: str
) -> None:
    with pytest.raises(CallSignatureError) as info:
        call(wg)
    err = info.value
    assert isinstance(err, TypeError) and isinstance(err, DispatchError)
    assert err.method == f"Bound.{method}" and err.parameter == parameter
    assert f"call {method!r} does not fit Bound.{method}(" in str(err) and says in str(err)
    if parameter is not None:
        assert repr(parameter) in str(err)
    assert _sent(wg, method) == 0, "a refused call reached a rank"


def test_calls_that_fit_run_as_before(wg: WorkerGroup[Bound]) -> None:
    assert wg.init_model(1.0) == [1.0, 1.0]
    assert wg.init_model(lr=1.0, seed=2) == [3.0, 3.0]
    assert len(wg.update(_batch())) == 4
    assert wg.later(5).get() == [5, 5]
    assert wg.static(3) == [3, 3]
    assert wg.execute_all("plain", 4) == [4, 4]


def test_user_modes_are_judged_by_what_they_send(wg: WorkerGroup[Bound]) -> None:
    assert wg.ranked(7) == [(7, 0), (7, 1)]  # the mode adds the rank: one driver argument is right
    assert wg.quiet(1, debug=True) == [1, 1]  # the mode drops debug=: the method need not take it


def test_methods_that_bind_anything_or_cannot_be_read_are_not_checked(wg: WorkerGroup[Bound]) -> None:
    assert wg.anything(1, 2, k=3) == [3, 3]
    with pytest.raises(WorkerError, match="TypeError"):  # unread on the driver: the rank's own error
        wg.unreadable()


def test_a_worker_method_missing_on_the_class_is_left_to_the_rank(wg: WorkerGroup[Bound]) -> None:
    with pytest.raises(WorkerError):
        wg.execute_all("no_such_method", 1)


def test_colocated_roles_are_bound_against_the_role_class() -> None:
    fused = create_colocated_worker_cls({"actor": Bound, "critic": Critic})
    with WorkerGroup(fused, 2) as wg:
        roles = wg.spawn(["actor", "critic"])
        for call in (
            lambda: wg.actor_init_model(),
            lambda: roles["actor"].init_model(1.0, sed=1),
            lambda: wg.execute_all("critic_score"),
            lambda: roles["critic"].execute_all("score", 1, 2),
        ):
            with pytest.raises(CallSignatureError, match=r"does not fit (Bound\.init_model|Critic\.score)\("):
                call()
        assert wg.actor_init_model(1.0) == [1.0, 1.0]
        assert roles["critic"].score(value=2) == [2, 2]
        assert wg.execute_all("critic_score", 3) == [3, 3]


def test_the_cores_own_methods_are_not_bound() -> None:
    class Meshed(Worker):
        def __init__(self) -> None:
            super().__init__()
            self._register_dispatch_collect_info("dp", dp_rank=self.rank, is_collect=True)

        @register(make_nd_compute_dataproto_dispatch_fn("dp"))
        def step(self, data: DataProto) -> DataProto:
            return data

    with WorkerGroup(Meshed, 2) as wg:
        assert len(wg.step(_batch())) == 4
        with pytest.raises(CallSignatureError, match="'data'"):
            wg.step()  # the mesh query behind it is the core's, and goes through


def test_the_signature_is_read_once_per_method(wg: WorkerGroup[Bound], monkeypatch: pytest.MonkeyPatch) -> None:
    wg.init_model(1.0)  # read here (or by an earlier test)

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("inspect.signature on the call path")

    monkeypatch.setattr(inspect, "signature", refuse)
    assert wg.init_model(2.0) == [2.0, 2.0]
    assert wg.init_model(2.0, seed=1) == [3.0, 3.0]  # a new shape binds against the kept signature
    with pytest.raises(CallSignatureError):
        wg.init_model(2.0, sed=1)


# -- the driver's verdict is Python's own -----------------------------------------------------------


def _signatures(self: Any, a: int, b: int = 0, *, c: int = 0) -> None: ...
def _positional_only(self: Any, a: int, /, b: int = 0) -> None: ...
def _var_positional(self: Any, a: int, *rest: int, c: int) -> None: ...
def _var_keyword(self: Any, *, a: int = 0, **rest: int) -> None: ...


FUNCTIONS = [_signatures, _positional_only, _var_positional, _var_keyword]


class Shapes(Worker):
    pass


for _fn in FUNCTIONS:
    setattr(Shapes, _fn.__name__, register(Dispatch.ONE_TO_ALL)(_fn))


@pytest.fixture(scope="module")
def shapes() -> Iterator[WorkerGroup[Shapes]]:
    group = WorkerGroup(Shapes, 1, backend="mock")
    yield group
    group.shutdown()


@given(
    fn=st.sampled_from(FUNCTIONS),
    n_args=st.integers(0, 4),
    keywords=st.lists(st.sampled_from(["a", "b", "c", "d", "rest"]), unique=True, max_size=3),
)
def test_the_driver_refuses_exactly_what_python_would(
    shapes: WorkerGroup[Shapes], fn: Any, n_args: int, keywords: list[str]
) -> None:
    args = list(range(n_args))
    kwargs = dict.fromkeys(keywords, 0)
    try:
        fn(object(), *args, **kwargs)
    except TypeError:
        python_refuses = True
    else:
        python_refuses = False
    try:
        getattr(shapes, fn.__name__)(*args, **kwargs)
    except CallSignatureError:
        refused = True
    else:
        refused = False
    assert refused == python_refuses


@pytest.fixture(scope="module", autouse=True)
def _modes() -> Iterator[None]:
    yield
    unregister_dispatch_mode("BIND_WITH_RANK")
    unregister_dispatch_mode("BIND_WITHOUT_DEBUG")
