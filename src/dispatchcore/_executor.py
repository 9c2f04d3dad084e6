"""The executor contract: what a backend plugin implements.

An executor owns processes, actors or threads; the core owns dispatch,
collect, padding and binding (DESIGN §6).  A backend subclasses
:class:`Executor`, sets :attr:`Executor.name`, and implements three things:

* ``__init__(spec)`` starts ``spec.world_size`` ranks, each hosting
  ``spec.worker_cls`` (use :class:`dispatchcore.WorkerHost` on the rank side;
  it sets ``rank``/``world_size`` before the worker's ``__init__`` and turns
  exceptions into :class:`RemoteFailure` records);
* :meth:`Executor.submit` sends a :class:`~dispatchcore.Call` to its ranks at
  once and returns a :class:`CallHandle` without waiting;
* :meth:`Executor.shutdown` releases everything, idempotently.

:meth:`CallHandle.result` is where every bound lives: it returns one value
per rank of the call, or raises :class:`~dispatchcore.WorkerError` (a rank
raised), :class:`~dispatchcore.WorkerDiedError` (a rank is gone; noticed
within ``spec.death_timeout``) or :class:`~dispatchcore.DispatchTimeoutError`.
It must never block forever.
"""

from __future__ import annotations

import importlib.util
import time
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from ._errors import DispatchTimeoutError

if TYPE_CHECKING:
    from ._call import Call
    from ._futures import DataProtoFuture


@dataclass(frozen=True)
class GroupSpec:
    """Everything an executor needs to start a group's ranks."""

    worker_cls: type
    world_size: int
    init_args: tuple[Any, ...] = ()
    init_kwargs: Mapping[str, Any] = field(default_factory=dict)
    isolate: bool = True
    call_timeout: float | None = None
    death_timeout: float = 60.0
    options: Mapping[str, Any] = field(default_factory=dict)
    #: A readable name, unique per process, for actors/threads/stores.
    name: str = "group"


class CallHandle(ABC):
    """An in-flight call; one per :meth:`Executor.submit`."""

    @abstractmethod
    def result(self, timeout: float | None = None) -> list[Any]:
        """Per-rank results in the order of ``call.ranks``.

        ``timeout`` (seconds, ``None`` for no bound) limits the wait; past it,
        raise :class:`~dispatchcore.DispatchTimeoutError`.  Calling again after
        success returns the same list.
        """

    @abstractmethod
    def done(self) -> bool:
        """Whether :meth:`result` would return (or raise) without waiting."""


class Executor(ABC):
    """Base class of every backend (see the module docstring)."""

    #: Backend name users pass as ``backend=``.
    name: ClassVar[str] = ""
    #: The ``dispatchcore[extra]`` that installs this backend's needs, if any.
    extra: ClassVar[str | None] = None
    #: Top-level modules that must be importable (checked without importing).
    requires: ClassVar[tuple[str, ...]] = ()

    def __init__(self, spec: GroupSpec) -> None:
        self.spec = spec
        self._broken: str | None = None

    @classmethod
    def missing_requirements(cls) -> list[str]:
        """Modules of :attr:`requires` that cannot be found."""
        return [m for m in cls.requires if importlib.util.find_spec(m) is None]

    @classmethod
    def launch_world_size(cls) -> int | None:
        """World size implied by how the program was launched (torchrun), if any."""
        return None

    @abstractmethod
    def submit(self, call: Call) -> CallHandle:
        """Start ``call`` on its ranks and return at once."""

    @abstractmethod
    def shutdown(self) -> None:
        """Release every rank; idempotent; must return promptly."""

    def forward_future(self, future: DataProtoFuture, chunks: int) -> tuple[list[Any], int, int] | None:
        """Per-chunk placeholders that let ranks fetch ``future``'s rows themselves.

        Return ``None`` (the default) to have the core resolve the future on the
        driver and chunk it.  Executors that can move data rank to rank return
        ``(parts, pad_size, padded_len)``: ``chunks`` objects they will
        recognise in a later :meth:`submit` (each resolving on its rank to a
        ``DataProto`` chunk whose ``meta_info`` carries ``PADDING_ROWS_KEY``),
        the padding rows added and the padded total length (for trimming).
        """
        return None

    def mark_broken(self, reason: str) -> None:
        """Refuse every later call (the first reason given is kept and reported)."""
        if self._broken is None:
            self._broken = reason

    @property
    def broken(self) -> str | None:
        """Why this group can take no more calls, or ``None`` while it can."""
        return getattr(self, "_broken", None)


def remaining(deadline: float | None) -> float | None:
    """Seconds left until ``deadline`` (a ``time.monotonic()`` value)."""
    if deadline is None:
        return None
    return max(0.0, deadline - time.monotonic())


def timeout_error(method: str, timeout: float | None, waiting_on: list[int]) -> DispatchTimeoutError:
    """The one wording of a call timeout, naming the ranks still running."""
    return DispatchTimeoutError(
        f"call {method!r} did not finish within {timeout:g} s; still waiting on "
        f"rank(s) {waiting_on}. Raise the bound with "
        f"wg.{method}.options(timeout=...) or WorkerGroup(call_timeout=...)"
        if timeout is not None
        else f"call {method!r} timed out waiting on rank(s) {waiting_on}"
    )
