"""Per-method proxies bound on a WorkerGroup, and the call each one runs: plan → submit → resolve → collect.

Each proxy class is named after its method, so tracebacks read ``update_actor``; each stage is a module.
"""

from __future__ import annotations

import dataclasses
import functools
import time
import types
from typing import Any, Generic, Never, ParamSpec, TypeVar

from .._base import DispatchAttributeError, DispatchError, WorkerDiedError, did_you_mean
from .._dispatch import CallFuture, DataProtoFuture, DispatchSpec, Registration, resolve_mode
from .._spi import remaining
from ._call_options import DEFAULT, check_call_options
from ._collect import collect
from ._plan import plan_call
from ._retry import should_retry
from ._site import CallSite
from ._stream import CallStream
from ._stuck import cancel_on_ranks, clear_stragglers, ended_early
from ._submit import send, submit
from ._tracing import CallTrace

P = ParamSpec("P")
D_co = TypeVar("D_co", covariant=True)


class MethodProxy(Generic[P, D_co]):
    """Calls one registered worker method through its group's dispatch mode (``P``: its parameters)."""

    __slots__ = ("_group", "_lazy", "_name", "_on_timeout", "_registration", "_site", "_timeout")

    def __init__(
        self,
        group: Any,
        site: CallSite,
        name: str,
        registration: Registration,
        timeout: Any = DEFAULT,
        lazy: bool | None = None,
        on_timeout: str = "raise",
    ):
        self._on_timeout = on_timeout
        self._group = group  # what the mode's dispatch and collect functions are handed (verl's ``wg``)
        self._site = site
        self._name = name
        self._registration = registration
        self._timeout = site.call_timeout if timeout is DEFAULT else timeout
        self._lazy = lazy

    def __call__(self, /, *args: P.args, **kwargs: P.kwargs) -> D_co:
        # ``self`` positional-only: ``wg.m(x, self=1)`` reaches the binder, which refuses it as a signature error.
        result: D_co = run_call(self, args, kwargs, self._lazy)
        return result

    def options(
        self,
        *,
        timeout: float | None = DEFAULT,
        lazy: bool | None = None,
        on_timeout: str | None = None,
        blocking: bool | None = None,
        **unknown: Never,
    ) -> MethodProxy[P, Any]:
        """This method with per-call settings, e.g. ``wg.step.options(timeout=5)(x)``.

        ``lazy=True`` keeps the DataProto result on the ranks; ``blocking=False`` returns a future.
        ``on_timeout="cancel"`` stops the call on its ranks past ``timeout``; the default ``"raise"``
        leaves them running and the group broken (a method stopped anywhere may leave half-written state).
        """
        check_call_options(unknown, timeout, lazy, on_timeout, blocking)
        registration = self._registration
        if blocking is not None and blocking != registration.blocking:
            registration = dataclasses.replace(registration, blocking=blocking)
        return type(self)(
            self._group, self._site, self._name, registration, self._timeout if timeout is DEFAULT else timeout,
            self._lazy if lazy is None else lazy, on_timeout or self._on_timeout,
        )  # fmt: skip

    def stream(self, /, *args: P.args, **kwargs: P.kwargs) -> CallStream:
        """Run the call and take its results as ranks finish: ``for part in wg.generate.stream(batch)``.

        ``ordered=True`` (the stream's own keyword) gives rank order; leaving
        the loop early cancels the call on the ranks still running it.
        """
        ordered = bool(kwargs.pop("ordered", False))
        return start_stream(self, args, kwargs, ordered)

    @property
    def registration(self) -> Registration:
        return self._registration

    def __repr__(self) -> str:
        mode = getattr(self._registration.dispatch_mode, "name", self._registration.dispatch_mode)
        return f"<{self._name} of {self._group!r}: dispatch {mode}>"


def proxy_class(name: str) -> type[MethodProxy[..., Any]]:
    """A MethodProxy subclass named ``name`` whose ``__call__`` shows as ``name``."""
    base_call = MethodProxy.__call__
    code = base_call.__code__.replace(co_name=name, co_qualname=f"{name}.__call__")
    call = types.FunctionType(code, base_call.__globals__, name, base_call.__defaults__, base_call.__closure__)
    call.__qualname__ = f"{name}.__call__"
    return type(name, (MethodProxy,), {"__slots__": (), "__call__": call, "__qualname__": name})


class MethodNamespace:
    """``wg.call``: the group's method proxies as attributes (see ``WorkerGroup.call``)."""

    __slots__ = ("_group",)

    def __init__(self, group: Any) -> None:
        self._group = group

    def __getattr__(self, name: str) -> MethodProxy[..., Any]:
        group = self._group
        if name in group.method_names:
            proxy: MethodProxy[..., Any] = getattr(group, name)
            return proxy
        if callable(getattr(group.worker_cls, name, None)):
            group.__getattr__(name)  # raises: "decorate it with @register"
        if name.startswith("__"):  # protocol lookups (copy, pickle): the plain answer
            raise AttributeError(name)
        raise DispatchAttributeError(
            f"{group.worker_cls.__name__} has no @register method {name!r}; its registered methods are "
            f"{group.method_names}{did_you_mean(name, group.method_names)}"
        )

    def __dir__(self) -> list[str]:
        return list(self._group.method_names)

    def __repr__(self) -> str:
        return f"<methods of {self._group!r}>"


def run_call(
    proxy: MethodProxy[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    lazy: bool | None,
    retried: bool = False,
) -> Any:
    """Run ``proxy``'s method on its site's ranks; the collected result, or a future of it."""
    group, site, name, registration = proxy._group, proxy._site, proxy._name, proxy._registration
    timeout = proxy._timeout
    spec = _begin(proxy)
    trace = CallTrace.begin(site.shared.label, site.prefix, name)
    cancels = proxy._on_timeout == "cancel" and timeout is not None
    # A call that cancels on timeout has no bound of its own: the handle would break the group at it.
    planned = plan_call(group, site, name, registration, spec, args, kwargs, None if cancels else timeout, lazy)
    call, handle = planned.call, send(group, site, planned.call, trace, True)
    deadline = None if timeout is None else time.monotonic() + timeout

    def resolve(wait: float | None) -> Any:
        try:
            results = handle.result(remaining(deadline) if wait is None else wait)
        except WorkerDiedError as exc:
            ended_early(site, handle, call, exc, trace)
            if not should_retry(group, site, exc, registration, call.method, planned.generation, retried):
                raise
            again = run_call(proxy, args, kwargs, planned.lazy, True)
            return again if registration.blocking else again.get()
        except BaseException as exc:
            past = cancels and deadline is not None and time.monotonic() >= deadline
            instead = ended_early(site, handle, call, exc, trace, cancel_after=timeout if past else None)
            if instead is not None:
                raise instead from None
            raise
        del planned.read_sources[:]  # the call is over: the rows it read may be freed
        if registration.setup:
            site.shared.membership.setup_log.record(call)
        if trace is not None:
            results = trace.executed(call, results)
        return collect(group, site, planned, results, handle.row_buffers, trace)

    if registration.blocking:
        return resolve(None)

    cancel = functools.partial(cancel_on_ranks, site, handle, call, "it was cancelled")

    if spec.returns_dataproto:
        ctx = planned.context
        return DataProtoFuture(
            resolve,
            handle.done,
            handle=handle,
            executor=site.executor,
            call=call,
            collect_positions=ctx.collect_positions,
            pad_size=ctx.pad_size,
            padded_len=ctx.padded_len,
            cancel=cancel,
        )
    return CallFuture(resolve, handle.done, cancel)


def _begin(proxy: MethodProxy[..., Any]) -> DispatchSpec:
    """What every call checks first: the mode can be called, the group is open, stragglers settled (before planning)."""
    name, site = proxy._name, proxy._site
    spec = resolve_mode(proxy._registration.dispatch_mode)
    if spec.direct:
        raise DispatchError(
            f"{name!r} is registered with Dispatch.DIRECT_ROLLOUT_METHOD: call it on the workers "
            "directly, not through the WorkerGroup"
        )
    site.check_open(proxy._group)
    clear_stragglers(proxy._group, site)
    return spec


def start_stream(
    proxy: MethodProxy[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], ordered: bool
) -> CallStream:
    """Plan and submit the call as :func:`run_call` does; its parts as ranks finish (see ``_stream``)."""
    group, site, name = proxy._group, proxy._site, proxy._name
    timeout = proxy._timeout
    spec = _begin(proxy)
    planned = plan_call(group, site, name, proxy._registration, spec, args, kwargs, None, proxy._lazy)
    if planned.unwrap:
        raise DispatchError(f"{name!r} runs on rank 0 only (Execute.RANK_ZERO): there is nothing to stream")
    call = planned.call
    submitted = submit(group, site, call, settled=True)
    handle = submitted.handle
    if not hasattr(handle, "position_outcome"):
        handle.result(timeout)
        raise DispatchError(
            f"the {site.shared.backend!r} backend's call handle does not report ranks one by one (it is not a "
            f"RankCallHandle), so {name!r} cannot be streamed; call it without .stream()"
        )

    def on_error(exc: BaseException) -> None:
        ended_early(site, handle, call, exc, submitted.trace, cancel_after=timeout)

    on_close = functools.partial(cancel_on_ranks, site, handle, call, "its stream was left early")
    return CallStream(site.shared.ledger, planned, submitted, ordered, timeout, on_error, on_close)
