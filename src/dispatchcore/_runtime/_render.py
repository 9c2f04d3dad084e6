"""A worker's exception as text for the driver, whatever the exception's own methods raise.

A rank renders every exception a worker raises (its type, ``str()`` and
traceback) into a ``RemoteFailure``.  User exceptions may break each of
those (a ``__str__``, ``__repr__`` or ``__getattr__`` that raises, a
``__notes__`` that is no list, a ``__getattribute__`` that refuses
everything): nothing here raises, so the rank reports the call and lives.
What could not be rendered reads as a placeholder naming what it raised,
``<str() raised ValueError>``.
"""

from __future__ import annotations

import traceback
from types import TracebackType

#: The exception's traceback, read past any ``__getattribute__`` of its class.
_TRACEBACK = BaseException.__dict__["__traceback__"]


def type_name(exc: BaseException) -> str:
    """The exception's class name (``__qualname__``), or a placeholder."""
    try:
        return str(type(exc).__qualname__)
    except BaseException:  # noqa: BLE001 - a metaclass's own attribute may raise
        return "<unnamed exception type>"


def message(exc: BaseException) -> str:
    """``str(exc)``, or ``<str() raised T>`` when that raises (``T``: what it raised)."""
    try:
        return str(exc)
    except BaseException as failed:  # noqa: BLE001 - whatever it raised, the rank reports and lives
        return f"<str() raised {type_name(failed)}>"


def traceback_text(exc: BaseException) -> str:
    """The formatted traceback (chained exceptions, notes); the frames alone where formatting raises."""
    tb = _own_traceback(exc)
    try:
        return "".join(traceback.format_exception(type(exc), exc, tb))
    except BaseException as failed:  # noqa: BLE001 - e.g. a __notes__ or __getattr__ that raises
        try:
            frames = "".join(traceback.format_tb(tb))
        except BaseException:  # noqa: BLE001
            frames = ""
        return (
            f"Traceback (most recent call last):\n{frames}{type_name(exc)}: {message(exc)}\n"
            f"(the full traceback could not be formatted: doing so raised {type_name(failed)})\n"
        )


def _own_traceback(exc: BaseException) -> TracebackType | None:
    try:
        tb: TracebackType | None = _TRACEBACK.__get__(exc, type(exc))
    except BaseException:  # noqa: BLE001
        return None
    return tb
