"""``@register`` and the dispatch-mode table: validation at decoration time, extension at run time."""

from __future__ import annotations

import pickle

import pytest

from dispatchcore import (
    Dispatch,
    Execute,
    RegistrationError,
    Worker,
    WorkerGroup,
    register,
    register_dispatch_mode,
    unregister_dispatch_mode,
    update_dispatch_mode,
)


def test_bad_mode_fails_at_decoration_time() -> None:
    with pytest.raises(RegistrationError, match="dispatch_mode must be a Dispatch member"):

        class Bad(Worker):
            @register(dispatch_mode="DP_COMPUTE")
            def f(self) -> None: ...


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"execute_mode": "ALL"}, "execute_mode"),
        ({"blocking": "yes"}, "blocking"),
        ({"materialize_futures": 1}, "materialize_futures"),
        ({"dispatch_mode": {"dispatch_fn": len}}, "collect_fn"),
        ({"dispatch_mode": {"dispatch_fn": 1, "collect_fn": len}}, "callable"),
    ],
)
def test_bad_options_fail_at_decoration_time(kwargs: dict, match: str) -> None:
    with pytest.raises(RegistrationError, match=match):
        register(**kwargs)


def test_defaults_positional_and_bare_forms() -> None:
    class Forms(Worker):
        @register
        def bare(self): ...

        @register(Dispatch.DP_COMPUTE)
        def positional(self): ...

        @register(dispatch_mode=Dispatch.ONE_TO_ALL, execute_mode=Execute.RANK_ZERO, blocking=False)
        async def coro(self): ...

    with WorkerGroup(Forms, 1, backend="local") as wg:  # a group's proxies carry each method's Registration
        bare, positional, coro = wg.bare.registration, wg.positional.registration, wg.coro.registration
    assert bare.dispatch_mode is Dispatch.ALL_TO_ALL
    assert bare.execute_mode is Execute.ALL
    assert positional.dispatch_mode is Dispatch.DP_COMPUTE
    assert coro.is_async and not coro.blocking


def test_double_registration_refused() -> None:
    with pytest.raises(RegistrationError, match="already decorated"):

        @register(Dispatch.ONE_TO_ALL)
        @register(Dispatch.ONE_TO_ALL)
        def f(self): ...


def test_dispatch_enum_surface() -> None:
    names = {m.name for m in Dispatch}
    assert {
        "RANK_ZERO",
        "ONE_TO_ALL",
        "ALL_TO_ALL",
        "DP_COMPUTE",
        "DP_COMPUTE_PROTO",
        "DP_COMPUTE_PROTO_WITH_FUNC",
        "DP_COMPUTE_METRIC",
        "DIRECT_ROLLOUT_METHOD",
    } <= names
    assert Dispatch["DP_COMPUTE"] is Dispatch.DP_COMPUTE
    assert pickle.loads(pickle.dumps(Dispatch.DP_COMPUTE)) is Dispatch.DP_COMPUTE
    with pytest.raises(AttributeError, match="NOPE"):
        _ = Dispatch.NOPE


def _first_two(wg, *args, **kwargs):
    keep = lambda v: [v if r < 2 else None for r in range(wg.world_size)]  # noqa: E731
    return tuple(keep(a) for a in args), {k: keep(v) for k, v in kwargs.items()}


def _sum(wg, outputs):
    return sum(o for o in outputs if o is not None)


def test_register_update_unregister_custom_mode() -> None:
    mode = register_dispatch_mode("FIRST_TWO_TEST", _first_two, _sum)
    try:
        assert mode in Dispatch and Dispatch.FIRST_TWO_TEST is mode
        with pytest.raises(RegistrationError, match="already exists"):
            register_dispatch_mode("FIRST_TWO_TEST", _first_two, _sum)

        class Adder(Worker):
            @register(dispatch_mode=mode)
            def add(self, x):
                return None if x is None else x + self.rank

        with WorkerGroup(Adder, 4) as wg:
            assert wg.add(10) == 10 + 11
            update_dispatch_mode(mode, _first_two, lambda wg, outputs: outputs)
            assert wg.add(1) == [1, 2, None, None]
    finally:
        unregister_dispatch_mode("FIRST_TWO_TEST")
    assert "FIRST_TWO_TEST" not in Dispatch
    with pytest.raises(RegistrationError):
        unregister_dispatch_mode("FIRST_TWO_TEST")
    with pytest.raises(RegistrationError, match="built-in"):
        unregister_dispatch_mode("DP_COMPUTE")
    with pytest.raises(RegistrationError, match="no dispatch mode"):
        update_dispatch_mode("NOT_THERE", _first_two, _sum)


def test_dict_mode_like_verl() -> None:
    class W(Worker):
        @register(dispatch_mode={"dispatch_fn": _first_two, "collect_fn": _sum})
        def add(self, x):
            return None if x is None else x

    with WorkerGroup(W, 3) as wg:
        assert wg.add(5) == 10


def test_mode_from_driver_unpickles_where_unregistered() -> None:
    mode = register_dispatch_mode("DRIVER_ONLY_TEST", _first_two, _sum)
    blob = pickle.dumps(mode)
    unregister_dispatch_mode("DRIVER_ONLY_TEST")
    stand_in = pickle.loads(blob)
    assert stand_in.name == "DRIVER_ONLY_TEST" and stand_in not in Dispatch
