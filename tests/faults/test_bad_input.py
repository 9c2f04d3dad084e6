"""Wrong calls against real groups: a typed error naming the problem, no hang, and the group still works.

Hypothesis draws the wrong calls of each category below; every one must
raise the category's :class:`~dispatchcore.DispatchError` subclass (so also
its builtin base, e.g. ``BatchSizeError`` is a ``ValueError``) with a
message that names the problem, within the group's call bound (a hang would
be a ``DispatchTimeoutError``, a failure), and the next good call on the same
group must return the right answer.  Empty batches are not errors: they
must simply work.

Every category runs on ``local``; ``ray``, ``torchrun`` and the example
``multiprocess`` plugin run each with fewer examples, sharing one group per
backend for the module.  The categories that stay wrong with one rank run
again on a world-size-1 group (``local`` and ``ray``).  One row per category
and backend goes to table ``bad-input/<backend>`` of RELIABILITY.md.
"""

from __future__ import annotations

import re
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dispatchcore import (
    BatchSizeError,
    CallSignatureError,
    DataProto,
    Dispatch,
    DispatchError,
    DispatchTypeError,
    Execute,
    RegistrationError,
    Worker,
    WorkerError,
    WorkerGroup,
    available_backends,
    make_nd_compute_dataproto_dispatch_fn,
    register,
    register_dispatch_mode,
    unregister_dispatch_mode,
)
from dispatchcore.testing.strategies import dataprotos

MESH = "bad_input_mesh"
PROCESS_BACKENDS = ("ray", "torchrun", "multiprocess")
#: Examples per category on a process backend (each example is a few real round trips).
PROCESS_EXAMPLES = 6
#: Bound on every call: a hang fails the test as a DispatchTimeoutError instead of stalling it.
CALL_TIMEOUT_S = 60.0


def _mode(name: str, dispatch_fn: Callable[..., Any]) -> Any:
    """A module-level custom mode; importing this module again in a rank process finds it registered."""
    if name in Dispatch:
        unregister_dispatch_mode(name)
    return register_dispatch_mode(name, dispatch_fn, lambda wg, outputs: list(outputs))


#: A user mode whose dispatch function returns its argument as is (the test draws what it returns).
JUNK_MODE = _mode("bad_input_junk", lambda wg, returned: returned)
#: A user mode that a test unregisters while a method still uses it.
DOOMED_NAME = "bad_input_doomed"


def _broadcast(wg: Any, *args: Any, **kwargs: Any) -> Any:
    return tuple([a] * wg.world_size for a in args), {k: [v] * wg.world_size for k, v in kwargs.items()}


DOOMED_MODE = _mode(DOOMED_NAME, _broadcast)


def _result_of(kind: str, rank: int, data: DataProto) -> Any:
    """What ``wrong_result`` returns on ``rank`` for ``kind``."""
    if kind == "dataproto":
        return data
    if kind == "other keys":  # a DataProto whose column name differs by rank
        return DataProto.from_dict({f"x{rank}": torch.zeros(len(data))})
    if kind == "tensor":
        return torch.zeros(len(data))
    return {"none": None, "dict": {"a": 1}, "list": [1, 2], "int": 3, "str": "s", "lock": threading.Lock()}[kind]


class Target(Worker):
    """A method per category: each does the plain thing, so only the call can be wrong."""

    def __init__(self) -> None:
        self.register_mesh(MESH, self.rank, True)

    @register(Dispatch.DP_COMPUTE_PROTO)
    def echo(self, data: DataProto) -> DataProto:
        return data

    @register(Dispatch.DP_COMPUTE_PROTO)
    def echo_pair(self, first: DataProto, second: DataProto | None = None) -> DataProto:
        return first

    @register(Dispatch.DP_COMPUTE_PROTO, blocking=False)
    def echo_later(self, data: DataProto) -> DataProto:
        return data

    @register(Dispatch.DP_COMPUTE_PROTO_WITH_FUNC)
    def apply(self, fn: Callable[[DataProto], DataProto], data: DataProto) -> DataProto:
        return fn(data)

    @register(Dispatch.DP_COMPUTE_METRIC)
    def count(self, data: DataProto) -> int:
        return len(data)

    @register(Dispatch.DP_COMPUTE)
    def pick(self, value: Any = None) -> Any:
        return value

    @register(Dispatch.ONE_TO_ALL)
    def kind(self, value: Any) -> str:
        return type(value).__name__

    @register(Dispatch.ONE_TO_ALL)
    def give(self, what: str) -> Any:
        return UNPICKLABLE[what]()

    @register(Dispatch.DP_COMPUTE_PROTO)
    def wrong_result(self, data: DataProto, kinds: list[str]) -> Any:
        return _result_of(kinds[self.rank], self.rank, data)

    @register(make_nd_compute_dataproto_dispatch_fn(MESH))
    def nd_echo(self, data: DataProto | None = None, extra: DataProto | None = None) -> DataProto:
        assert data is not None
        return data

    @register(make_nd_compute_dataproto_dispatch_fn("bad_input_undeclared_mesh"))
    def nd_undeclared(self, data: DataProto) -> DataProto:
        return data

    @register(JUNK_MODE)
    def junk(self, *args: Any) -> Any:
        return args

    @register(DOOMED_MODE)
    def doomed(self) -> None:
        return None

    @register(Dispatch.DIRECT_ROLLOUT_METHOD)
    def direct(self) -> None:
        return None

    def undecorated(self) -> None:
        return None


def _ship_by_value() -> None:
    """Ray's worker processes cannot import this test module (the driver's ``sys.path`` does not
    travel), so its classes and functions go to every process backend by value."""
    try:
        import cloudpickle
    except ImportError:  # no process backend installed: nothing is pickled across processes
        return
    cloudpickle.register_pickle_by_value(sys.modules[__name__])


_ship_by_value()


# -- values that cannot be pickled -------------------------------------------------------


def _generator() -> Iterator[int]:
    yield 1


def _lock_closure() -> Callable[[], Any]:
    lock = threading.Lock()
    return lambda: lock


#: Fresh unpicklable objects, by name (ranks build results from the same table).
UNPICKLABLE: dict[str, Callable[[], Any]] = {
    "lock": threading.Lock,
    "rlock": threading.RLock,
    "event": threading.Event,
    "generator": _generator,
}


def _wrapped(value: Any, how: str, n: int) -> tuple[str, tuple[Any, ...]]:
    """``value`` placed as an argument: bare, in a container, or inside a DataProto (method, args)."""
    if how == "bare":
        return "kind", (value,)
    if how == "list":
        return "kind", ([1, value],)
    if how == "dict":
        return "kind", ({"k": {"deep": value}},)
    data = DataProto.from_dict({"x": torch.arange(2 * n)})
    if how == "meta_info":
        data.meta_info["handle"] = value
    else:
        data.non_tensor_batch["obj"] = np.array([value] * len(data), dtype=object)
    return "echo", (data,)


# -- the categories ------------------------------------------------------------------------


@dataclass(frozen=True)
class Category:
    """Wrong calls of one kind: how to draw one, make it, and what it must raise.

    ``draw(n)`` gives a strategy of call values for world size ``n``;
    ``call(wg, value)`` makes the call (``value`` may say how).  ``raises`` is
    the error class (``None``: the call must succeed and ``check`` holds);
    ``names`` is a regex its message must match.
    """

    name: str
    draw: Callable[[int], st.SearchStrategy[Any]]
    call: Callable[[WorkerGroup[Target], Any], Any]
    raises: type[BaseException] | None
    names: str = ""
    check: Callable[[Any, Any, int], bool] | None = None
    #: Runs on world size 1 too (categories whose wrongness survives n=1).
    single_rank: bool = True


def _dp(length: int) -> DataProto:
    return DataProto.from_dict({"x": torch.arange(length)}, non_tensors={"i": np.arange(length)})


def _lengths_not_divisible(n: int) -> st.SearchStrategy[int]:
    return st.integers(1, 8 * n).filter(lambda k: k % n != 0)


def _wrong_length_lists(n: int) -> st.SearchStrategy[Any]:
    wrong_len = st.integers(0, n + 3).filter(lambda k: k != n)
    sequences = wrong_len.flatmap(lambda k: st.sampled_from([list, tuple]).map(lambda t: t(range(k))))
    scalars = st.one_of(st.integers(), st.text(max_size=3), st.none(), st.just({"a": 1}), st.just(torch.arange(n)))
    return st.tuples(st.one_of(sequences, scalars), st.booleans())


def _call_pick(wg: WorkerGroup[Target], drawn: tuple[Any, bool]) -> Any:
    value, as_keyword = drawn
    return wg.pick(value=value) if as_keyword else wg.pick(value)


def _not_dataprotos(n: int) -> st.SearchStrategy[Any]:
    options = [
        st.none(),
        st.integers(),
        st.text(max_size=5),
        st.just({"x": torch.arange(2 * n)}),
        st.just(torch.arange(2 * n)),
        st.just(np.arange(2 * n)),
        st.just([_dp(2), _dp(2)]),
    ]
    return st.tuples(st.one_of(options), st.sampled_from(["echo", "echo keyword", "count", "later", "nd keyword"]))


def _call_with_non_dataproto(wg: WorkerGroup[Target], drawn: tuple[Any, str]) -> Any:
    value, how = drawn
    if how == "echo":
        return wg.echo(value)
    if how == "echo keyword":
        return wg.echo(data=value)
    if how == "count":
        return wg.count(value)
    if how == "later":
        return wg.echo_later(value).get()
    return wg.nd_echo(data=value)


def _mismatched(n: int) -> st.SearchStrategy[Any]:
    rows = st.integers(0, 6).map(lambda k: k * n)
    pairs = st.tuples(rows, rows).filter(lambda p: p[0] != p[1])
    return st.tuples(pairs, st.sampled_from(["positional", "keywords", "nd keywords"]))


def _call_mismatched(wg: WorkerGroup[Target], drawn: tuple[tuple[int, int], str]) -> Any:
    (a, b), how = drawn
    if how == "positional":
        return wg.echo_pair(_dp(a), _dp(b))
    if how == "keywords":
        return wg.echo_pair(first=_dp(a), second=_dp(b))
    return wg.nd_echo(data=_dp(a), extra=_dp(b))


def _indivisible(n: int) -> st.SearchStrategy[Any]:
    return st.tuples(_lengths_not_divisible(n), st.sampled_from(["echo", "count", "nd keyword", "later"]))


def _call_indivisible(wg: WorkerGroup[Target], drawn: tuple[int, str]) -> Any:
    rows, how = drawn
    data = _dp(rows)
    if how == "echo":
        return wg.echo(data)
    if how == "count":
        return wg.count(data)
    if how == "nd keyword":
        return wg.nd_echo(data=data)
    return wg.echo_later(data)  # refused when called, before any future exists


def _inconsistent(n: int) -> st.SearchStrategy[Any]:
    return st.tuples(st.integers(1, 6).map(lambda k: k * n), st.sampled_from(["short column", "padding_rows"]))


def _call_inconsistent(wg: WorkerGroup[Target], drawn: tuple[int, str]) -> Any:
    rows, how = drawn
    data = _dp(rows)
    if how == "short column":  # a column replaced after construction, behind the DataProto's back
        data.non_tensor_batch["i"] = np.arange(rows - 1)
    else:
        data.meta_info["padding_rows"] = rows + 1
    return wg.echo(data)


def _unpicklable_args(n: int) -> st.SearchStrategy[Any]:
    how = st.sampled_from(["bare", "list", "dict", "meta_info", "non_tensor column"])
    return st.tuples(st.sampled_from(sorted(UNPICKLABLE)), how)


def _call_unpicklable(wg: WorkerGroup[Target], drawn: tuple[str, str]) -> Any:
    method, args = _wrapped(UNPICKLABLE[drawn[0]](), drawn[1], wg.world_size)
    return getattr(wg, method)(*args)


def _wrong_results(n: int) -> st.SearchStrategy[Any]:
    kinds = ["dataproto", "other keys", "tensor", "none", "dict", "list", "int", "str", "lock"]
    valid = ({"dataproto"}, {"tensor"}, {"none"})
    per_rank = st.lists(st.sampled_from(kinds), min_size=n, max_size=n).filter(
        lambda ks: set(ks) not in valid and not (n == 1 and ks == ["other keys"])
    )
    return st.tuples(per_rank, st.booleans())


def _call_wrong_result(wg: WorkerGroup[Target], drawn: tuple[list[str], bool]) -> Any:
    kinds, as_keyword = drawn
    data = _dp(2 * wg.world_size)
    return wg.wrong_result(data, kinds=kinds) if as_keyword else wg.wrong_result(data, kinds)


def _junk_dispatch(n: int) -> st.SearchStrategy[Any]:
    return st.one_of(
        st.none(),
        st.integers(),
        st.just(([1] * n,)),  # no kwargs part
        st.just(([1] * n, [1] * n)),  # kwargs not a dict
        st.just(((1,), {})),  # an argument that is not a per-rank list
        st.just(([[1] * (n + 1)], {})),  # a per-rank list of the wrong length
        st.just(({"a": [1] * n}, {})),
    )


def _junk_modes(n: int) -> st.SearchStrategy[Any]:
    return st.one_of(
        st.text(max_size=20),
        st.integers(),
        st.floats(allow_nan=False),
        st.sampled_from(list(Execute)),
        st.lists(st.integers(), max_size=2),
        st.just({"dispatch_fn": len}),
        st.just({"dispatch_fn": 1, "collect_fn": 2}),
        st.just(("DP_COMPUTE_PROTO",)),
    )


def _declare_with_mode(wg: WorkerGroup[Target], mode: Any) -> Any:
    return register(dispatch_mode=mode)(lambda self: None)


def _junk_execute(n: int) -> st.SearchStrategy[Any]:
    return st.one_of(
        st.text(max_size=20),
        st.integers(),
        st.sampled_from(list(Dispatch)[:4]),
        st.booleans(),
    )


def _declare_with_execute(wg: WorkerGroup[Target], execute: Any) -> Any:
    return register(Dispatch.ONE_TO_ALL, execute_mode=execute)(lambda self: None)


def _call_doomed(wg: WorkerGroup[Target], _: Any) -> Any:
    unregister_dispatch_mode(DOOMED_NAME)
    try:
        return wg.doomed()
    finally:
        _mode(DOOMED_NAME, _broadcast)


def _misrouted(n: int) -> st.SearchStrategy[Any]:
    return st.sampled_from(["direct rollout method", "no function", "not a function"])


def _call_misrouted(wg: WorkerGroup[Target], how: str) -> Any:
    if how == "direct rollout method":
        return wg.direct()
    if how == "no function":
        return wg.apply(_dp(2 * wg.world_size))
    return wg.apply(3, _dp(2 * wg.world_size))


def _signature(n: int) -> st.SearchStrategy[Any]:
    return st.sampled_from(["extra positional", "unknown keyword", "missing argument", "by name"])


def _call_signature(wg: WorkerGroup[Target], how: str) -> Any:
    if how == "extra positional":
        return wg.kind(1, 2)
    if how == "unknown keyword":
        return wg.kind(1, colour="red")
    if how == "missing argument":
        return wg.kind()
    return wg.execute_all("kind", 1, 2)


def _unknown_method(n: int) -> st.SearchStrategy[Any]:
    return st.just("no_such_method")


def _call_unknown_method(wg: WorkerGroup[Target], name: str) -> Any:
    return wg.execute_all(name)


def _nd_keywords(n: int) -> st.SearchStrategy[Any]:
    bad = st.sampled_from(["odd length", "undeclared mesh", "not a DataProto"])
    return st.tuples(st.integers(0, 4).map(lambda k: k * n), bad)


def _call_nd_keywords(wg: WorkerGroup[Target], drawn: tuple[int, str]) -> Any:
    rows, how = drawn
    assert len(wg.nd_echo(data=_dp(rows))) == rows  # keywords only is a good call
    if how == "odd length" and wg.world_size > 1:
        return wg.nd_echo(data=_dp(rows + 1))
    if how == "not a DataProto":
        return wg.nd_echo(data=list(range(rows)))
    return wg.nd_undeclared(data=_dp(rows))


def _empty(n: int) -> st.SearchStrategy[Any]:
    empties = st.one_of(
        dataprotos(min_len=0, max_len=0, auto_padding=None),
        st.just(DataProto()),
        st.just(DataProto.from_dict(non_tensors={"o": np.array([], dtype=object)})),
    )
    return st.tuples(empties, st.sampled_from(["echo", "count", "nd keyword", "later", "rank zero"]))


def _call_empty(wg: WorkerGroup[Target], drawn: tuple[DataProto, str]) -> Any:
    data, how = drawn
    if how == "echo":
        return wg.echo(data)
    if how == "count":
        return wg.count(data)
    if how == "nd keyword":
        return wg.nd_echo(data=data)
    if how == "later":
        return wg.echo_later(data).get()
    return wg.execute_rank_zero("echo", data)


def _empty_ok(drawn: tuple[DataProto, str], result: Any, n: int) -> bool:
    if drawn[1] == "count":
        return bool(result == [0] * n)
    return isinstance(result, DataProto) and len(result) == 0


#: ``name`` -> category; the names are the rows of the RELIABILITY.md table.
CATEGORIES: dict[str, Category] = {
    c.name: c
    for c in (
        Category(
            "DP_COMPUTE list of the wrong length or not a list",
            _wrong_length_lists,
            _call_pick,
            BatchSizeError,
            r"one entry per rank \(\d+\)",
        ),
        Category(
            "batch length not divisible, padding off",
            _indivisible,
            _call_indivisible,
            BatchSizeError,
            r"length \d+ into \d+ equal chunks.*auto_padding=True",
            single_rank=False,
        ),
        Category(
            "DataProto arguments of different lengths",
            _mismatched,
            _call_mismatched,
            BatchSizeError,
            r"different lengths \(\d+ and \d+ rows",
        ),
        Category(
            "inconsistent DataProto (column or padding_rows)",
            _inconsistent,
            _call_inconsistent,
            BatchSizeError,
            r"non_tensor_batch\['i'\] has \d+ rows|padding_rows'\]=\d+ is not a row count",
        ),
        Category(
            "non-DataProto to a DataProto mode",
            _not_dataprotos,
            _call_with_non_dataproto,
            DispatchTypeError,  # a type problem: names the type received
            r"none of its arguments is a DataProto, DataProtoFuture or TensorDict \(got .+\)",
        ),
        Category(
            "unpicklable argument",
            _unpicklable_args,
            _call_unpicklable,
            DispatchError,
            r"pickl",
        ),
        Category(
            "unpicklable result",
            lambda n: st.sampled_from(sorted(UNPICKLABLE)),
            lambda wg, what: wg.give(what),
            WorkerError,
            r"result (cannot|could not) be pickled",
        ),
        Category(
            "non-DataProto or mismatched result from a DataProto mode",
            _wrong_results,
            _call_wrong_result,
            DispatchError,
            r"rank \d+: \w+|cannot be concatenated|result (cannot|could not) be pickled",
        ),
        Category(
            "user dispatch function returning junk",
            _junk_dispatch,
            lambda wg, returned: wg.junk(returned),
            DispatchError,
            r"dispatch function of mode 'bad_input_junk' returned",
        ),
        Category(
            "unknown dispatch mode at @register",
            _junk_modes,
            _declare_with_mode,
            RegistrationError,
            r"dispatch_mode",
        ),
        Category(
            "dispatch mode unregistered after @register",
            lambda n: st.just(None),
            _call_doomed,
            RegistrationError,
            r"no longer registered",
        ),
        Category(
            "wrong execute mode at @register",
            _junk_execute,
            _declare_with_execute,
            RegistrationError,
            r"execute_mode must be Execute.ALL or Execute.RANK_ZERO",
        ),
        Category(
            "mode misuse (direct-rollout method, missing function)",
            _misrouted,
            _call_misrouted,
            DispatchError,
            r"call it on the workers directly|takes a function as its first argument",
        ),
        Category(
            "arguments the worker method does not take",
            _signature,
            _call_signature,
            CallSignatureError,  # bound on the driver: nothing is sent
            r"call 'kind' does not fit Target\.kind\(value\): .*('value'|'colour'|too many positional)",
        ),
        Category(
            "a method the worker does not have (by name)",
            _unknown_method,
            _call_unknown_method,
            WorkerError,
            r"has no method 'no_such_method'",
        ),
        Category(
            "nd mode called with keywords only",
            _nd_keywords,
            _call_nd_keywords,
            DispatchError,
            r"equal chunks|none of its arguments is a DataProto|registered no mesh 'bad_input_undeclared_mesh'",
        ),
        Category(
            "empty batches (must work)",
            _empty,
            _call_empty,
            None,
            check=_empty_ok,
        ),
    )
}


# -- groups, one per backend and world size for the module ------------------------------------


@pytest.fixture(scope="module")
def group_for(request: pytest.FixtureRequest) -> Iterator[Callable[[str, int], WorkerGroup[Target]]]:
    made: dict[tuple[str, int], WorkerGroup[Target] | BaseException] = {}

    def get(backend: str, world_size: int) -> WorkerGroup[Target]:
        if backend not in available_backends():
            pytest.skip(f"backend {backend!r} is not installed")
        if backend == "ray":
            request.getfixturevalue("ray_session")
        key = (backend, world_size)
        if key not in made:
            try:
                made[key] = WorkerGroup(Target, world_size, backend=backend, call_timeout=CALL_TIMEOUT_S)
            except Exception as exc:  # noqa: BLE001 - remembered: one failed start, not one per test
                made[key] = exc
        group = made[key]
        if isinstance(group, BaseException):
            raise AssertionError(f"the {backend} group of world size {world_size} did not start") from group
        return group

    yield get
    for group in made.values():
        if not isinstance(group, BaseException):
            group.shutdown()


def _good_call(wg: WorkerGroup[Target]) -> None:
    """The call every bad one is followed by: it must still give the right answer."""
    data = _dp(2 * wg.world_size)
    out = wg.echo(data)
    assert torch.equal(out.batch["x"], data.batch["x"]), "the group answered wrongly after a bad call"


def _excerpt(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    return first if len(first) <= 160 else first[:157] + "..."


#: World size 1 runs on these (a group each; the other process backends share their transport code paths).
SINGLE_RANK_BACKENDS = ("local", "ray")


def _params(world_size: int) -> list[Any]:
    out = []
    for backend in ("local", *PROCESS_BACKENDS) if world_size > 1 else SINGLE_RANK_BACKENDS:
        marks = [] if backend == "local" else [pytest.mark.slow, pytest.mark.timeout(240)]
        for name, category in CATEGORIES.items():
            if world_size == 1 and not category.single_rank:
                continue
            out.append(pytest.param(backend, name, marks=marks, id=f"{backend}-{name}"))
    return out


def _run_category(backend: str, name: str, world_size: int, group_for: Any, record: Any) -> None:
    category = CATEGORIES[name]
    wg = group_for(backend, world_size)
    seen: list[BaseException | None] = []
    examples = settings().max_examples if backend == "local" else min(settings().max_examples, PROCESS_EXAMPLES)

    @settings(max_examples=examples, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(category.draw(world_size))
    def check(drawn: Any) -> None:
        try:
            result = category.call(wg, drawn)
        except BaseException as exc:  # noqa: BLE001 - the suite inspects what was raised
            if category.raises is None or not isinstance(exc, category.raises):
                raise AssertionError(f"{name}: {drawn!r} raised {type(exc).__name__}, not {category.raises}") from exc
            assert re.search(category.names, str(exc), re.S), f"{name}: message does not name the problem: {exc}"
            seen.append(exc)
        else:
            if category.raises is not None:
                raise AssertionError(f"{name}: {drawn!r} returned {result!r} instead of raising")
            assert category.check is not None and category.check(drawn, result, world_size), (drawn, result)
            seen.append(None)
        _good_call(wg)

    check()
    first = next((e for e in seen if e is not None), None)
    table = f"bad-input/{backend}" if world_size > 1 else f"bad-input/{backend} (world size 1)"
    record(
        table,
        case=name,
        raised=type(first).__name__ if first is not None else "nothing (works)",
        message=_excerpt(first) if first is not None else "",
        examples=len(seen),
        usable_after="yes",
    )


@pytest.mark.parametrize(("backend", "name"), _params(2))
def test_bad_input(backend: str, name: str, group_for: Any, record: Any) -> None:
    _run_category(backend, name, 2, group_for, record)


@pytest.mark.parametrize(("backend", "name"), _params(1))
def test_bad_input_world_size_one(backend: str, name: str, group_for: Any, record: Any) -> None:
    _run_category(backend, name, 1, group_for, record)


@pytest.mark.parametrize(
    "backend",
    ["local", *(pytest.param(b, marks=[pytest.mark.slow, pytest.mark.timeout(240)]) for b in PROCESS_BACKENDS)],
)
def test_callable_closing_over_a_lock(backend: str, group_for: Any, record: Any) -> None:
    """Local ranks get the very function (in-process isolation passes callables by reference,
    as pickle does importable ones); process ranks need it pickled, which fails with a clear error."""
    wg = group_for(backend, 2)
    if backend == "local":
        assert wg.kind(_lock_closure()) == ["function", "function"]
        raised, message = "nothing (works: in-process ranks share callables)", ""
    else:
        with pytest.raises(DispatchError, match="pickl") as info:
            wg.kind(_lock_closure())
        raised, message = type(info.value).__name__, _excerpt(info.value)
    _good_call(wg)
    record(
        f"bad-input/{backend}",
        case="lambda closing over a lock",
        raised=raised,
        message=message,
        examples=1,
        usable_after="yes",
    )


def test_undecorated_method_is_an_attribute_error_naming_register(group_for: Any) -> None:
    """Attribute lookup, so ``AttributeError`` (``hasattr`` keeps working), not a DispatchError."""
    wg = group_for("local", 2)
    with pytest.raises(AttributeError, match=r"not decorated with @register"):
        wg.undecorated()
    _good_call(wg)
