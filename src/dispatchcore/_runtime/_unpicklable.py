"""The one wording, on every backend, for what the ranks need but cannot be pickled (path to the culprit, fix)."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from typing import Any

from .._base import UnpicklableError
from .._spi import Call, GroupSpec
from .._wire import Culprit, dumps_in_process, find_unpicklable
from ._render import message, type_name

#: What to do about data that cannot be pickled.
ARGUMENT_FIX = (
    "each rank gets a pickled copy of what it is sent: pass picklable values (plain data, tensors, numpy "
    "arrays, DataProto; not locks, open files, sockets or generators) and make such objects on the ranks, "
    "in the worker's __init__"
)
#: What to do when the culprit sits in code that travels by value.
CODE_FIX = (
    "classes and functions defined in the driver script travel to the ranks by value (cloudpickle), with "
    "their class attributes, closures and the globals they use: create the lock (or file, socket...) in "
    "the worker's __init__, so each rank makes its own, or define that class or function in an importable "
    "module (it then travels by reference)"
)
_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def describe(culprit: Culprit | None, exc: BaseException) -> str:
    """What the culprit is and what pickling it raised, e.g. ``cannot pickle '_thread.lock' object``."""
    if culprit is None:
        return f"{type_name(exc)}: {message(exc)}"
    kind = type(culprit.value)
    name = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
    text = message(culprit.error)
    return text if name in text else f"a {name}: {text}"


def wording(where: str, culprit: Culprit | None, exc: BaseException, fix: str | None = None) -> str:
    """``<where> cannot be pickled (<what>); <fix>``, the shape of every such message."""
    if fix is None:
        fix = CODE_FIX if culprit is not None and culprit.by_value else ARGUMENT_FIX
    return f"{where} cannot be pickled ({describe(culprit, exc)}); {fix}"


def unpicklable_error(method: str, value: Any, exc: BaseException, *, in_process: bool = False) -> UnpicklableError:
    """Driver side, before sending: ``value``, an argument of call ``method``, cannot be pickled."""
    culprit = find_unpicklable(value, "value", share_callables=in_process)
    where = culprit.where("an argument") if culprit is not None else "an argument"
    message = f"call {method!r} was not sent: {wording(where, culprit, exc)}"
    return UnpicklableError(message, where=where, method=method, in_process=in_process)


def unpicklable_call_error(
    call: Call, worker_cls: type | None, exc: BaseException, *, in_process: bool = False
) -> UnpicklableError | None:
    """The error naming which argument of ``call`` cannot be pickled, or ``None`` if every one pickles."""
    names = _parameter_names(worker_cls, call.method)
    for label, expr, value in _call_values(call, names):
        culprit = find_unpicklable(value, expr, share_callables=in_process)
        if culprit is not None:
            where = culprit.where(label)
            message = f"call {call.method!r} was not sent: {wording(where, culprit, exc)}"
            return UnpicklableError(message, where=where, method=call.method, in_process=in_process)
    return None


def unpicklable_spec_error(spec: GroupSpec, exc: BaseException) -> UnpicklableError:
    """Group creation, before any rank gets it: the worker class or an init argument cannot be pickled."""
    cls = spec.worker_cls
    head = f"the group of {cls.__name__} was not started"
    for label, expr, value in _spec_values(spec):
        culprit = find_unpicklable(value, expr)
        if culprit is not None:
            where = culprit.where(label)
            return UnpicklableError(f"{head}: {wording(where, culprit, exc)}", where=where, method="__init__")
    where = f"worker class {cls.__name__} with its init arguments"
    return UnpicklableError(f"{head}: {wording(where, None, exc)}", where=where, method="__init__")


def check_spec_picklable(spec: GroupSpec) -> None:
    """Pickle the worker class and init arguments as a process backend would; raise the one error if they do not.

    For executors that pickle nothing at start-up, so they refuse what another backend would.
    """
    try:
        dumps_in_process((spec.worker_cls, tuple(spec.init_args), dict(spec.init_kwargs)))
    except Exception as exc:
        raise unpicklable_spec_error(spec, exc) from exc


def _parameter_names(cls: type | None, method: str) -> list[str]:
    """The names of ``cls.method``'s positional parameters (``self`` left out); ``[]`` when unknown."""
    fn = getattr(cls, method, None) if cls is not None else None
    if fn is None:
        return []
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return []
    static = isinstance(inspect.getattr_static(cls, method, None), staticmethod)
    if params and not static and params[0].kind in _POSITIONAL:
        params = params[1:]
    return [p.name for p in params if p.kind in _POSITIONAL]


def _spec_values(spec: GroupSpec) -> Iterator[tuple[str, str, Any]]:
    """``(label, path name, value)`` for the worker class and each init argument."""
    cls = spec.worker_cls
    yield f"worker class {cls.__name__}", cls.__name__, cls
    names = _parameter_names(cls, "__init__")
    for i, value in enumerate(spec.init_args):
        if i < len(names):
            yield f"init argument {names[i]!r}", names[i], value
        else:
            yield f"init argument {i}", f"init_args[{i}]", value
    for key, value in spec.init_kwargs.items():
        yield f"init argument {key!r}", str(key), value


def _call_values(call: Call, names: list[str]) -> Iterator[tuple[str, str, Any]]:
    """``(label, path name, value)`` for each distinct argument object of the call, rank noted where they differ."""
    slots: list[tuple[int | str, list[tuple[int, Any]]]] = []
    for i in range(max((len(a) for a in call.args), default=0)):
        slots.append((i, [(p, args[i]) for p, args in enumerate(call.args) if i < len(args)]))
    for key in dict.fromkeys(k for kwargs in call.kwargs for k in kwargs):
        slots.append((key, [(p, kwargs[key]) for p, kwargs in enumerate(call.kwargs) if key in kwargs]))
    seen: set[int] = set()
    for slot, values in slots:
        if isinstance(slot, int):
            label, expr = (repr(names[slot]), names[slot]) if slot < len(names) else (str(slot), f"args[{slot}]")
        else:
            label, expr = repr(slot), slot
        shared = all(v is values[0][1] for _, v in values)
        for position, value in values:
            if id(value) not in seen:
                seen.add(id(value))
                rank = "" if shared else f" of rank {call.ranks[position]}"
                yield f"argument {label}{rank}", expr, value
