"""A worker exception that cannot be rendered (its ``__str__``, ``__repr__``, attributes or traceback raise).

Each reaches the driver as a ``WorkerError`` naming the rank, the method and the exception's type (a
placeholder where ``str()`` raised), and every rank lives: the same group answers the next call.  On
local, self-started torchrun and Ray, one group per backend going through every case.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from dispatchcore import Dispatch, Worker, WorkerError, WorkerGroup, available_backends, register


class StrRaises(Exception):
    def __str__(self) -> str:
        raise ValueError("no text for this one")


class StrExits(Exception):
    """Its ``__str__`` raises what ``except Exception`` lets through."""

    def __str__(self) -> str:
        raise SystemExit(3)


class StrNotText(Exception):
    def __str__(self) -> Any:
        return 42  # str() then raises TypeError


class HoldsLock(Exception):
    def __init__(self) -> None:
        super().__init__("holds a lock")
        self.lock = threading.Lock()


class ReduceRaises(Exception):
    def __reduce__(self) -> Any:
        raise TypeError("cannot reduce this one")


class ReprRaises(Exception):
    def __repr__(self) -> str:
        raise ValueError("no repr for this one")


class GetattrRaises(Exception):
    """Every missing attribute raises (``traceback`` asks for ``__notes__``)."""

    def __getattr__(self, name: str) -> Any:
        raise ValueError(f"no attribute {name}")


class NotesRaise(Exception):
    """Formatting its traceback raises."""

    @property
    def __notes__(self) -> list[str]:
        raise RuntimeError("no notes for this one")


class AttributesRaise(Exception):
    """Every attribute read raises, ``__class__`` and ``__traceback__`` included."""

    def __getattribute__(self, name: str) -> Any:
        raise ValueError(f"no {name}")


class CauseUnrenderable(Exception):
    """Raised from one whose every method raises: the chain is formatted too."""


#: Each case: the exception's type name and the message the driver must get (``None``: any).
CASES: dict[str, tuple[str, str | None]] = {
    "str": ("StrRaises", "<str() raised ValueError>"),
    "str_exits": ("StrExits", "<str() raised SystemExit>"),
    "str_not_text": ("StrNotText", "<str() raised TypeError>"),
    "lock": ("HoldsLock", "holds a lock"),
    "reduce": ("ReduceRaises", "plain"),
    "repr": ("ReprRaises", "plain"),
    "getattr": ("GetattrRaises", "plain"),
    "notes": ("NotesRaise", "plain"),
    "attributes": ("AttributesRaise", None),
    "cause": ("CauseUnrenderable", "plain"),
}


class Unsendable:
    """A result whose pickling raises an exception that cannot be rendered."""

    def __reduce__(self) -> Any:
        raise StrRaises()


def _make(kind: str) -> BaseException:
    if kind == "str":
        return StrRaises()
    if kind == "str_exits":
        return StrExits()
    if kind == "str_not_text":
        return StrNotText()
    if kind == "lock":
        return HoldsLock()
    if kind == "cause":
        error = CauseUnrenderable("plain")
        error.__cause__ = GetattrRaises()
        return error
    by_kind = {"reduce": ReduceRaises, "repr": ReprRaises, "getattr": GetattrRaises, "notes": NotesRaise}
    return by_kind[kind]("plain") if kind in by_kind else AttributesRaise("plain")


class Raiser(Worker):
    @register(Dispatch.ONE_TO_ALL)
    def explode(self, kind: str) -> None:
        raise _make(kind)

    @register(Dispatch.ONE_TO_ALL)
    def unsendable(self) -> Unsendable:
        return Unsendable()

    @register(Dispatch.ONE_TO_ALL)
    def ping(self) -> int:
        return self.rank


def _every_case_reported_and_ranks_live(wg: WorkerGroup[Any]) -> None:
    assert wg.ping() == [0, 1]
    for kind, (type_name, text) in CASES.items():
        with pytest.raises(WorkerError) as info:
            wg.explode(kind)
        error = info.value
        assert (error.rank, error.method, error.exc_type) == (0, "explode", type_name), kind
        if text is not None:
            assert error.exc_message == text, kind
        assert type_name in str(error) and "explode" in error.remote_traceback, kind  # the driver renders it
        assert wg.ping() == [0, 1], f"a rank died after the {kind!r} case"
    with pytest.raises(WorkerError, match="cannot be pickled") as info:
        wg.unsendable()
    assert (info.value.rank, info.value.method) == (0, "unsendable")
    assert "<str() raised ValueError>" in info.value.exc_message
    assert wg.ping() == [0, 1], "a rank died after a result that could not be pickled"


def test_local() -> None:
    with WorkerGroup(Raiser, 2, backend="local") as wg:
        _every_case_reported_and_ranks_live(wg)


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.skipif("torchrun" not in available_backends(), reason="torchrun backend not installed")
def test_torchrun_self_started() -> None:
    with WorkerGroup(Raiser, 2, backend="torchrun") as wg:
        _every_case_reported_and_ranks_live(wg)


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.skipif("ray" not in available_backends(), reason="ray backend not installed")
def test_ray(ray_session: Any) -> None:
    with WorkerGroup(Raiser, 2, backend="ray") as wg:
        _every_case_reported_and_ranks_live(wg)
