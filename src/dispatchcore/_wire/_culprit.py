"""Which object inside a value keeps it from pickling, and the path to it (``W.score → Registry.lock``).

Only the parts that fail to pickle are walked, so it costs nothing until something has failed.
"""

from __future__ import annotations

import functools
import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ._serialization import dumps

#: Types that always pickle (never descended into, never tried).
_ALWAYS = frozenset({type(None), bool, int, float, complex, str, bytes, range, type(Ellipsis)})
#: Class attributes every class has; never where a user put an unpicklable value.
_CLASS_NOISE = frozenset({"__dict__", "__weakref__", "__module__", "__doc__", "__qualname__", "__slots__"})
#: How deep, and how many pickling attempts, before the search stops at what it has.
_MAX_DEPTH = 40
_MAX_TRIES = 5000
#: A child's path text that starts with its parent's and goes on with one of these extends it.
_EXTENDS = (".", "[", "{", " ")

Child = tuple[str, Any, bool]  # (path text, object, reached through code that travels by value)


@dataclass(frozen=True)
class Culprit:
    """The innermost object that cannot be pickled, and how it was reached.

    ``path`` is the hops after the root (``()``: the root itself;
    ``("W.score", "Registry.lock")``).  ``by_value``: the path passes through
    code that travels by value, where the fix is in the code, not the data.
    """

    path: tuple[str, ...]
    value: Any
    error: BaseException
    by_value: bool

    def where(self, root: str) -> str:
        """``root`` followed by the path, joined by arrows (``argument 'cfg' → cfg['callback']``)."""
        return " → ".join((root, *self.path))


def find_unpicklable(obj: Any, name: str = "value", *, share_callables: bool = False) -> Culprit | None:
    """``None`` if ``obj`` pickles (as :func:`dumps` would), else its :class:`Culprit`; ``name`` spells ``obj``."""
    search = _Search(share_callables)
    error = search.fails(obj)
    return None if error is None else search.descend(obj, error, [name], by_value=False)


class _Search:
    def __init__(self, share_callables: bool) -> None:
        self.share_callables = share_callables
        self.tries = 0
        self.seen: set[int] = set()

    def fails(self, obj: Any) -> BaseException | None:
        """What pickling ``obj`` raises, or ``None``."""
        kind = type(obj)  # tensors and non-object arrays always pickle: skipped, which keeps big containers cheap
        if kind in _ALWAYS or kind is torch.Tensor or (kind is np.ndarray and obj.dtype != object):
            return None
        self.tries += 1
        try:
            dumps(obj, share_callables=self.share_callables)
        except Exception as exc:  # noqa: BLE001 - any pickling failure is what is looked for
            return exc
        return None

    def descend(self, obj: Any, error: BaseException, segments: list[str], by_value: bool) -> Culprit:
        """The culprit under ``obj`` (which fails with ``error``): the first failing child, recursively."""
        root = segments[0]
        for _depth in range(_MAX_DEPTH):
            self.seen.add(id(obj))
            found = self._failing_child(obj, segments[-1]) if self.tries < _MAX_TRIES else None
            if found is None:
                break
            (text, obj, through_code), error = found
            segments = _step(segments, text)
            by_value = by_value or through_code
        # The root spelled as given is no hop of its own: ``cfg`` → ``cfg`` would say nothing.
        return Culprit(tuple(segments[1:] if segments[0] == root else segments), obj, error, by_value)

    def _failing_child(self, obj: Any, expr: str) -> tuple[Child, BaseException] | None:
        for child in _children(obj, expr):
            if id(child[1]) in self.seen:
                continue
            error = self.fails(child[1])
            if error is not None:
                return child, error
            if self.tries >= _MAX_TRIES:
                return None
        return None


def _step(segments: list[str], text: str) -> list[str]:
    """The path after moving to a child spelled ``text``: it extends the last hop, or starts a new one."""
    last = segments[-1]
    if text == last or (text.startswith(last) and text[len(last) : len(last) + 1] in _EXTENDS):
        return [*segments[:-1], text]
    return [*segments, text]


def _children(obj: Any, expr: str) -> Iterator[Child]:
    """What pickling ``obj`` pickles in turn, each with its path text."""
    if isinstance(obj, dict):
        yield from ((f"{expr}[{k!r}]", v, False) for k, v in obj.items())
        yield from ((f"{expr} key {k!r}", k, False) for k in obj)
    elif isinstance(obj, (list, tuple)):
        yield from ((f"{expr}[{i}]", v, False) for i, v in enumerate(obj))
    elif isinstance(obj, (set, frozenset)):
        yield from ((f"{expr}{{{v!r:.40}}}", v, False) for v in obj)
    elif isinstance(obj, np.ndarray):
        yield from ((f"{expr}[{_index(i)}]", v, False) for i, v in np.ndenumerate(obj))
    elif isinstance(obj, type):
        yield from _class_children(obj)
    elif isinstance(obj, types.FunctionType):
        yield from _function_children(obj)
    elif isinstance(obj, (classmethod, staticmethod)):
        yield expr, obj.__func__, True
    elif isinstance(obj, property):
        yield from ((f"{expr}.{k}", f, True) for k in ("fget", "fset", "fdel") if (f := getattr(obj, k)) is not None)
    elif isinstance(obj, types.MethodType):
        yield f"{expr}.__self__", obj.__self__, False
        yield f"{expr}.__func__", obj.__func__, True
    elif isinstance(obj, functools.partial):
        yield f"{expr}.func", obj.func, False
        yield from ((f"{expr}.args[{i}]", v, False) for i, v in enumerate(obj.args))
        yield from ((f"{expr}.keywords[{k!r}]", v, False) for k, v in obj.keywords.items())
    else:
        yield from _object_children(obj, expr)


def _index(index: tuple[int, ...]) -> str:
    return str(index[0]) if len(index) == 1 else ", ".join(map(str, index))


def _class_children(cls: type) -> Iterator[Child]:
    """A class that travels by value: its own attributes, then its bases."""
    for key, value in vars(cls).items():
        if key not in _CLASS_NOISE:
            yield f"{cls.__name__}.{key}", value, True
    for base in cls.__bases__:
        if base is not object:
            yield base.__name__, base, True


def _function_children(fn: types.FunctionType) -> Iterator[Child]:
    """A function that travels by value: its closure, the globals its code uses, its defaults."""
    cells = fn.__closure__ or ()
    for var, cell in zip(fn.__code__.co_freevars, cells, strict=False):
        try:
            yield var, cell.cell_contents, True
        except ValueError:  # an empty cell
            continue
    module_globals = fn.__globals__
    for global_name in _global_names(fn.__code__):
        if global_name in module_globals:
            yield global_name, module_globals[global_name], True
    for i, value in enumerate(fn.__defaults__ or ()):
        yield f"{fn.__name__}.__defaults__[{i}]", value, True
    for key, value in (fn.__kwdefaults__ or {}).items():
        yield f"{fn.__name__}.__kwdefaults__[{key!r}]", value, True
    for key, value in vars(fn).items():
        yield f"{fn.__name__}.{key}", value, True


def _global_names(code: types.CodeType) -> list[str]:
    """Names ``code`` (and the code nested in it) may look up as globals, in order, once each."""
    names = dict.fromkeys(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names.update(dict.fromkeys(_global_names(const)))
    return list(names)


def _object_children(obj: Any, expr: str) -> Iterator[Child]:
    """An instance: its attributes, then its class; the standard library's objects are culprits as a whole."""
    if type(obj).__module__.partition(".")[0] in sys.stdlib_module_names:
        return
    attributes = getattr(obj, "__dict__", None)
    if isinstance(attributes, dict):
        yield from ((f"{expr}.{k}", v, False) for k, v in attributes.items())
    for klass in type(obj).__mro__:
        for slot in getattr(klass, "__slots__", ()):
            if isinstance(slot, str) and slot not in ("__dict__", "__weakref__") and hasattr(obj, slot):
                yield f"{expr}.{slot}", getattr(obj, slot), False
    kind = type(obj)
    if kind.__module__ != "builtins":
        yield kind.__name__, kind, True
