"""``WorkerGroup``: the driver's handle on N ranks hosting one worker class.

The group turns ``wg.method(*args)`` into dispatch (split per the method's
mode), one :class:`~dispatchcore.Call` to the executor, and collect.  It is
identical for every backend; only the executor behind it changes.
"""

from __future__ import annotations

import atexit
import itertools
import os
import threading
import time
import weakref
from collections.abc import Iterable, Mapping
from typing import Any, Generic, TypeVar, cast

from .._base._errors import DispatchError, RegistrationError, WorkerDiedError
from .._dispatch._builtin_modes import collect_list, dispatch_all_to_all
from .._dispatch._call_context import CallContext, call_context
from .._dispatch._call_context import enter_call as _enter_call
from .._dispatch._call_context import leave_call as _leave_call
from .._dispatch._futures import CallFuture, DataProtoFuture
from .._dispatch._modes import Execute, resolve_mode
from .._dispatch._register import Registration, registered_methods
from .._rows._lazy_chunk import KEEP_ROWS_KWARG, send_lazy_arguments
from .._rows._lazy_dataproto import LazyDataProto
from .._rows._ledger import DEFAULT_BUDGET, RemoteRows, RowLedger
from .._spi._call import Call
from .._spi._executor_base import Executor, GroupSpec, remaining
from .._spi._plugins import get_executor_class
from .._trace._driver_traffic import count_received
from .._trace._tracer import TimedResult, Tracer, active_tracer, now_us
from .._worker._colocate import method_names
from ._call_checks import per_rank_values, submit_call
from ._group_view import select_by_index, select_ranks
from ._membership import ON_RANK_DEATH, Membership, MembershipChange, SetupLog
from ._method_proxy import DEFAULT, MethodNamespace, proxy_class

W = TypeVar("W")

_EXECUTE_RANK_ZERO = Execute.RANK_ZERO

BACKEND_ENV = "DISPATCHCORE_BACKEND"
DEFAULT_BACKEND = "local"

_live_groups: weakref.WeakSet[WorkerGroup[Any]] = weakref.WeakSet()
_names = itertools.count()
_labels = itertools.count()
_call_ids = itertools.count()
_keep_tokens = itertools.count()


def resolve_backend(backend: str | None, config: Mapping[str, Any] | None = None) -> str:
    """Backend choice, first set wins: argument, config, environment, ``local``."""
    if backend:
        return backend
    if config is not None and config.get("backend"):
        return str(config["backend"])
    return os.environ.get(BACKEND_ENV) or DEFAULT_BACKEND


def _check_timeout(label: str, value: Any, allow_none: bool = True) -> float | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        allowed = " or None" if allow_none else ""
        raise ValueError(f"{label} must be a positive number of seconds{allowed}, got {value!r}")
    return float(value)


class WorkerGroup(Generic[W]):
    """N ranks hosting ``worker_cls``; one proxy attribute per ``@register`` method."""

    _executor: Executor
    _closed: bool

    def __init__(
        self,
        worker_cls: type[W],
        world_size: int | None = None,
        *,
        backend: str | None = None,
        init_args: tuple[Any, ...] = (),
        init_kwargs: Mapping[str, Any] | None = None,
        call_timeout: float | None = None,
        death_timeout: float = 60.0,
        isolate: bool = True,
        on_rank_death: str = "raise",
        lazy: bool = False,
        lazy_budget_bytes: int | None = DEFAULT_BUDGET,
        **backend_options: Any,
    ) -> None:
        if not isinstance(worker_cls, type):
            raise TypeError(f"worker_cls must be a class, got {worker_cls!r}")
        self._backend = resolve_backend(backend)
        executor_cls = get_executor_class(self._backend)
        if world_size is None:
            world_size = executor_cls.launch_world_size()
            if world_size is None:
                raise ValueError(
                    f"world_size is required for backend {self._backend!r} (it is implied only under torchrun); "
                    f"pass WorkerGroup({worker_cls.__name__}, world_size=N)"
                )
        if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
            raise ValueError(f"world_size must be an int >= 1, got {world_size!r}")
        if not isinstance(isolate, bool):
            raise TypeError(f"isolate must be True or False, got {isolate!r}")
        if not isinstance(init_args, (tuple, list)):
            raise TypeError(f"init_args must be a tuple, got {type(init_args).__name__}")
        if on_rank_death not in ON_RANK_DEATH:
            raise ValueError(
                f"on_rank_death must be one of {list(ON_RANK_DEATH)}, got {on_rank_death!r}; 'replace' "
                "starts a new rank in place of a dead one (backends that can: ray) and retries retry=True calls"
            )
        if not isinstance(lazy, bool):
            raise TypeError(f"lazy must be True or False, got {lazy!r}")
        if lazy_budget_bytes is not None and (
            isinstance(lazy_budget_bytes, bool) or not isinstance(lazy_budget_bytes, int) or lazy_budget_bytes < 0
        ):
            raise ValueError(f"lazy_budget_bytes must be a number of bytes >= 0 or None, got {lazy_budget_bytes!r}")
        self._lazy = lazy
        self._on_rank_death = on_rank_death
        self._membership = Membership()
        self._call_timeout = _check_timeout("call_timeout", call_timeout)
        death = _check_timeout("death_timeout", death_timeout, allow_none=False)
        methods = registered_methods(worker_cls)
        _refuse_collisions(worker_cls, methods)
        self._worker_cls = worker_cls
        self._world_size = world_size
        self._all_ranks = tuple(range(world_size))
        self._methods = methods
        self._prefix = ""
        self._parent: WorkerGroup[Any] | None = None
        self._mesh_cache: dict[str, list[tuple[int, bool]]] = {}
        self._closed = True  # until the executor is up
        self._label = f"{worker_cls.__name__}#{next(_labels)}"
        self._lock = threading.Lock()
        name = backend_options.pop("name", None) or f"{worker_cls.__name__}-{os.getpid()}-{next(_names)}"
        spec = GroupSpec(
            worker_cls=worker_cls,
            world_size=world_size,
            init_args=tuple(init_args),
            init_kwargs=dict(init_kwargs or {}),
            isolate=isolate,
            call_timeout=self._call_timeout,
            death_timeout=death,  # type: ignore[arg-type]
            options=dict(backend_options),
            name=str(name),
            methods=method_names(worker_cls),
        )
        self._executor = executor_cls(spec)
        self._ledger = RowLedger(self._executor, lazy_budget_bytes)
        self._closed = False
        self._bind()
        _live_groups.add(self)

    # -- construction helpers -------------------------------------------------
    @classmethod
    def from_config(cls, config: Mapping[str, Any], worker_cls: type[W], **kwargs: Any) -> WorkerGroup[W]:
        """Build from any mapping with ``backend``, ``world_size`` and a per-backend section.

        Keys ``call_timeout``, ``death_timeout`` and ``isolate`` are read too;
        keyword arguments win over the config.
        """
        if not isinstance(config, Mapping) and not hasattr(config, "get"):
            raise TypeError(f"config must be a mapping (dict, OmegaConf), got {type(config).__name__}")
        backend = resolve_backend(kwargs.pop("backend", None), config)
        for key in ("world_size", "call_timeout", "death_timeout", "isolate", "init_kwargs"):
            if key not in kwargs and config.get(key) is not None:
                kwargs[key] = _plain(config.get(key))
        section = config.get(backend)
        options = _plain(section) if section is not None else {}
        if not isinstance(options, dict):
            raise TypeError(f"config[{backend!r}] must be a mapping of backend options, got {type(section).__name__}")
        return cls(worker_cls, backend=backend, **{**options, **kwargs})

    def _bind(self) -> None:
        for name, registration in self._methods.items():
            setattr(self, name, proxy_class(name)(self, name, registration))

    def _view(self, worker_cls: type, prefix: str, ranks: tuple[int, ...] | None = None) -> WorkerGroup[Any]:
        """A group sharing this one's ranks (or ``ranks`` of them), calling methods named ``prefix + name``."""
        ranks = self._all_ranks if ranks is None else ranks
        view: WorkerGroup[Any] = object.__new__(type(self))
        view.__dict__.update(
            _backend=self._backend,
            _executor=self._executor,
            _call_timeout=self._call_timeout,
            _worker_cls=worker_cls,
            _world_size=len(ranks),
            _all_ranks=ranks,
            _methods=self._methods if worker_cls is self._worker_cls else registered_methods(worker_cls),
            _prefix=prefix,
            _parent=self._parent or self,
            _mesh_cache={},
            _closed=False,
            _lock=threading.Lock(),
        )
        view._bind()
        return view

    def spawn(self, prefix_set: Any) -> dict[str, WorkerGroup[Any]]:
        """Per-role groups of a colocated worker class, sharing these ranks (verl's name)."""
        roles: dict[str, type] | None = getattr(self._worker_cls, "_dispatchcore_roles", None)
        if roles is None:
            raise DispatchError(
                f"spawn() needs a group built from create_colocated_worker_cls(...); "
                f"{self._worker_cls.__name__} hosts one role"
            )
        wanted = list(prefix_set)
        unknown = [r for r in wanted if r not in roles]
        if unknown:
            raise KeyError(f"unknown role(s) {unknown}; this colocated class hosts {sorted(roles)}")
        return {role: self._view(roles[role], f"{self._prefix}{role}_") for role in wanted}

    # -- sub-group views -----------------------------------------------------------
    def __getitem__(self, index: int | slice) -> WorkerGroup[W]:
        """A view calling only the ranks ``index`` selects: ``wg[0:2]``, ``wg[::2]``, ``wg[3]``.

        Dispatch is computed for the view's size (a DP split over ``wg[0:2]``
        makes two chunks); the view shares these ranks (their state, their
        processes), and its rank numbers are positions in this group.
        """
        return self._view(self._worker_cls, self._prefix, select_by_index(self._all_ranks, index))

    def ranks(self, ranks: Iterable[int]) -> WorkerGroup[W]:
        """A view calling only ``ranks`` (distinct numbers of this group), in the order given."""
        return self._view(self._worker_cls, self._prefix, select_ranks(self._all_ranks, ranks))

    @property
    def rank_ids(self) -> tuple[int, ...]:
        """The ranks of the whole group this group calls, in order (``0..world_size-1`` unless a view)."""
        return self._all_ranks

    # -- typed calls ---------------------------------------------------------------
    @property
    def call(self) -> type[W]:
        """The registered methods, typed for checkers: ``wg.call.update_actor(batch)``.

        At run time this is a namespace of the same proxies as
        ``wg.update_actor``.  It is *typed* as the worker class so that a type
        checker reads each method's driver signature off its ``@register``
        declaration (parameters kept, result per the mode, see
        ``dispatchcore._dispatch._typed_method``) and reports misspelled names.
        """
        return cast("type[W]", MethodNamespace(self))

    # -- for executors' adapters (public, so they need nothing private) -------------
    @property
    def executor(self) -> Executor:
        """The executor running this group's ranks (shared by ``spawn``'s views)."""
        return self._executor

    @property
    def role_prefix(self) -> str:
        """``"<role>_"`` for a view from :meth:`spawn` (its methods' names on the ranks), else ``""``."""
        return self._prefix

    @property
    def setup_log(self) -> SetupLog:
        """The setup calls (``@register(..., setup=True)``) a replacement rank replays, in order."""
        return (self._parent or self)._membership.setup_log

    @property
    def call_timeout(self) -> float | None:
        """The group's default call bound (``None``: calls may run as long as they need)."""
        return self._call_timeout

    def replace_rank(self, *ranks: int) -> MembershipChange:
        """Start new processes for ``ranks`` (dead ones, or hung ones: killed first) and rebuild the group.

        Each new rank runs the worker's ``__init__``, replays the setup calls
        it took part in, in order; then every rank runs
        ``Worker.on_membership_change`` (see ``dispatchcore._group._membership``).
        Returns what changed.  Backends that cannot start ranks (local
        threads, ranks started by the torchrun launcher) raise
        :class:`DispatchError`.
        """
        root = self._parent or self
        if root._closed:
            raise DispatchError(f"{self!r} is shut down; create a new WorkerGroup")
        wanted = tuple(sorted(set(ranks)))
        bad = [r for r in ranks if isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < self._world_size]
        if not wanted or bad:
            raise ValueError(f"replace_rank needs rank numbers in 0..{self._world_size - 1}, got {list(ranks)}")
        wanted = tuple(sorted(self._all_ranks[r] for r in wanted))  # a view's ranks are positions in it
        return root._membership.replace(root, wanted)

    def ensure_usable(self) -> None:
        """Raise :class:`DispatchError` if the group is shut down or broken."""
        self._check_open()

    # -- calling ---------------------------------------------------------------
    def _check_open(self) -> None:
        root = self._parent or self
        if root._closed or self._closed:  # a view shut down refuses calls; its parent goes on
            raise DispatchError(f"{self!r} is shut down; create a new WorkerGroup")
        reason = self._executor.broken
        if reason:
            raise DispatchError(f"{self!r} can take no more calls: {reason}. Shut it down and create a new one")

    def _call_method(
        self,
        name: str,
        registration: Registration,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        timeout: Any,
        retried: bool = False,
        lazy: bool | None = None,
    ) -> Any:
        spec = resolve_mode(registration.dispatch_mode)
        if spec.direct:
            raise DispatchError(
                f"{name!r} is registered with Dispatch.DIRECT_ROLLOUT_METHOD: call it on the workers "
                "directly, not through the WorkerGroup"
            )
        self._check_open()
        requested_timeout = timeout
        call_args, call_kwargs = args, kwargs
        root = self._parent or self
        generation = root._membership.generation
        if timeout is DEFAULT:
            timeout = self._call_timeout
        unwrap = registration.execute_mode is _EXECUTE_RANK_ZERO
        if lazy is None:
            lazy = registration.lazy if registration.lazy is not None else root._lazy
        lazy = lazy and spec.returns_dataproto
        ledger = root._ledger
        ledger.flush()
        ctx = CallContext(name, self._world_size)
        tracer = active_tracer()
        started = now_us() if tracer is not None else 0.0
        token = _enter_call(ctx)
        try:
            if registration.materialize_futures and not spec.returns_dataproto and (args or kwargs):
                args, kwargs = _materialize(args, kwargs)
            per_rank_args, per_rank_kwargs = per_rank_values(spec.dispatch_fn(self, *args, **kwargs), spec.name, name)
        finally:
            _leave_call(token)
        per_rank_args, per_rank_kwargs, read_sources = _send_data(self._executor, per_rank_args, per_rank_kwargs)
        if lazy:
            per_rank_kwargs[KEEP_ROWS_KWARG] = [f"{os.getpid()}-{next(_keep_tokens)}"] * self._world_size
        call = self._make_call(
            name,
            spec.name,
            per_rank_args,
            per_rank_kwargs,
            spec.rank_zero_only or unwrap,
            timeout,
            copied=spec.returns_dataproto and not unwrap,
        )
        if tracer is not None:
            submitted = now_us()
            call_id = next(_call_ids)
            name = f"{self._prefix[:-1]}.{name}" if self._prefix else name  # role-qualified in the trace
            tracer.slice("driver", f"{name} dispatch", started, submitted, phase="dispatch", method=name, call=call_id)
            call.timed = True
        handle = submit_call(self._executor, call, self._backend)
        deadline = None if timeout is None else time.monotonic() + timeout

        def resolve(wait: float | None) -> Any:
            try:
                results = handle.result(remaining(deadline) if wait is None else wait)
            except WorkerDiedError as exc:
                if exc.seen_by is not None:  # a producing rank (maybe of another group) died, not ours
                    raise
                ledger.dead.add(exc.rank)
                if root._on_rank_death != "replace" or retried:
                    raise
                root._membership.recover(root, exc.rank, generation)
                if not registration.retry:
                    exc.add_note(
                        f"rank {exc.rank} was replaced (on_rank_death='replace') and the group takes calls "
                        f"again; {call.method!r} was not retried: register it with retry=True if it is safe "
                        "to run twice"
                    )
                    raise
                again = self._call_method(
                    call.method[len(self._prefix) :],
                    registration,
                    call_args,
                    call_kwargs,
                    requested_timeout,
                    True,
                    lazy,
                )
                return again if registration.blocking else again.get()
            del read_sources[:]  # the call is over: the rows it read may be freed
            if registration.setup:
                root._membership.setup_log.record(call)
            if tracer is not None:
                results = self._record_ranks(tracer, name, call, results, submitted, call_id)
            if lazy:
                results = [
                    LazyDataProto.of_remote(r) if isinstance(r, RemoteRows) else r
                    for r in ledger.adopt(call.ranks, results)
                ]
            else:
                count_received(results)
            if unwrap:
                return results[0]
            ctx.row_buffers = handle.row_buffers
            token = _enter_call(ctx)
            collect_start = now_us() if tracer is not None else 0.0
            try:
                return spec.collect_fn(self, results)
            finally:
                _leave_call(token)
                ctx.row_buffers = None  # claimable once: a retried collect copies
                if tracer is not None:
                    tracer.slice(
                        "driver", f"{name} collect", collect_start, now_us(), phase="collect", method=name, call=call_id
                    )

        if registration.blocking:
            return resolve(None)
        if spec.returns_dataproto:
            return DataProtoFuture(
                resolve,
                handle.done,
                handle=handle,
                executor=self._executor,
                call=call,
                collect_positions=ctx.collect_positions,
                pad_size=ctx.pad_size,
                padded_len=ctx.padded_len,
            )
        return CallFuture(resolve, handle.done)

    def _record_ranks(
        self, tracer: Tracer, name: str, call: Call, results: list[Any], submitted: float, call_id: int
    ) -> list[Any]:
        """Unwrap rank timings into trace slices; return the plain results."""
        label = (self._parent or self)._label
        arrived = now_us()
        tracer.slice("driver", f"{name} execute", submitted, arrived, phase="execute", method=name, call=call_id)
        plain = []
        for rank, value in zip(call.ranks, results, strict=True):
            if isinstance(value, TimedResult):
                tracer.slice(
                    f"{label} rank {rank}",
                    name,
                    value.start_us,
                    value.end_us,
                    phase="compute",
                    method=name,
                    call=call_id,
                    rank=rank,
                    pid=value.pid,
                )
                value = value.value
            plain.append(value)
        return plain

    def _make_call(
        self,
        name: str,
        mode_name: str,
        per_rank_args: Any,
        per_rank_kwargs: Any,
        rank_zero: bool,
        timeout: float | None,
        copied: bool = False,
    ) -> Call:
        n = self._world_size
        for i, v in enumerate((*per_rank_args, *per_rank_kwargs.values())):
            if not isinstance(v, (list, tuple)) or len(v) != n:
                where = (
                    f"argument {i}"
                    if i < len(per_rank_args)
                    else f"keyword {list(per_rank_kwargs)[i - len(per_rank_args)]!r}"
                )
                size = f"{len(v)} entries" if isinstance(v, (list, tuple)) else f"a {type(v).__name__}"
                raise DispatchError(
                    f"dispatch function of mode {mode_name!r} returned {where} of {name!r} as {size}; "
                    f"it must be a list with one entry per rank ({n})"
                )
        # Per-rank lists are indexed by position in this group; the call names real ranks (views).
        ranks = self._all_ranks[:1] if rank_zero else self._all_ranks
        count = len(ranks)
        # Every list has n entries (checked above): zip transposes them into one tuple per rank.
        args = list(itertools.islice(zip(*per_rank_args, strict=True), count)) if per_rank_args else [()] * count
        if per_rank_kwargs:
            keys = tuple(per_rank_kwargs)
            per_rank = itertools.islice(zip(*per_rank_kwargs.values(), strict=True), count)
            kwargs = [dict(zip(keys, values, strict=True)) for values in per_rank]
        else:
            kwargs = [{} for _ in ranks]
        return Call(self._prefix + name, ranks, args, kwargs, timeout, copied)

    def _raw_call(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any], rank_zero: bool) -> list[Any]:
        self._check_open()
        with call_context(CallContext(method=name, world_size=self._world_size)):
            per_rank_args, per_rank_kwargs = dispatch_all_to_all(self, *args, **kwargs)
        call = self._make_call(name, "ALL_TO_ALL", per_rank_args, per_rank_kwargs, rank_zero, self._call_timeout)
        return submit_call(self._executor, call, self._backend).result(self._call_timeout)

    def execute_all(self, method_name: str, *args: Any, **kwargs: Any) -> list[Any]:
        """Run any worker method on every rank (verl's ALL_TO_ALL rule for arguments)."""
        return collect_list(self, self._raw_call(method_name, args, kwargs, rank_zero=False))

    def execute_rank_zero(self, method_name: str, *args: Any, **kwargs: Any) -> Any:
        """Run any worker method on rank 0 only and return its value."""
        return self._raw_call(method_name, args, kwargs, rank_zero=True)[0]

    def _mesh_info(self, mesh_name: str) -> list[tuple[int, bool]]:
        """Every rank's (dp_rank, is_collect) on ``mesh_name``, asked once."""
        with self._lock:
            cached = self._mesh_cache.get(mesh_name)
        if cached is None:
            answers = self._raw_call("_dispatchcore_mesh_info", (mesh_name,), {}, rank_zero=False)
            cached = [(int(dp), bool(c)) for dp, c in answers]
            if len(self._all_ranks) < (self._parent or self)._world_size:
                # A view over some dp ranks splits over those only, renumbered 0..k-1.
                present = {dp: i for i, dp in enumerate(sorted({dp for dp, _ in cached}))}
                cached = [(present[dp], c) for dp, c in cached]
            with self._lock:
                self._mesh_cache[mesh_name] = cached
        return cached

    # -- attributes and lifetime ----------------------------------------------
    @property
    def world_size(self) -> int:
        return self._world_size

    @property
    def backend(self) -> str:
        """The backend's name, e.g. ``"local"``."""
        return self._backend

    @property
    def worker_cls(self) -> type:
        return self._worker_cls

    @property
    def method_names(self) -> list[str]:
        """Names of the registered methods bound on this group."""
        return sorted(self._methods)

    def __getattr__(self, name: str) -> Any:
        worker_cls = self.__dict__.get("_worker_cls")
        if worker_cls is not None and not name.startswith("__") and callable(getattr(worker_cls, name, None)):
            raise AttributeError(
                f"{worker_cls.__name__}.{name} is not decorated with @register, so the group has no "
                f"proxy for it. Decorate it with @register(dispatch_mode=...) or call "
                f"wg.execute_all({name!r}, ...)"
            )
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")

    def shutdown(self) -> None:
        """Release every rank; idempotent; views leave the shared ranks to their parent."""
        if self._closed:
            return
        self._closed = True
        if self._parent is None:
            self._executor.shutdown()

    def __enter__(self) -> WorkerGroup[W]:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    def __repr__(self) -> str:
        name = getattr(self, "_worker_cls", type(None)).__name__
        state = " closed" if self.__dict__.get("_closed") else ""
        ranks = self.__dict__.get("_all_ranks", ())
        if ranks != tuple(range(len(ranks))):
            state = f" ranks {list(ranks)}{state}"
        return f"<WorkerGroup {name} x{self.__dict__.get('_world_size')} on {self.__dict__.get('_backend')!r}{state}>"


_GROUP_ATTRS = frozenset(n for n in dir(WorkerGroup) if not n.startswith("__"))


def _refuse_collisions(worker_cls: type, methods: Mapping[str, Registration]) -> None:
    clashes = sorted(set(methods) & _GROUP_ATTRS)
    if clashes:
        raise RegistrationError(
            f"{worker_cls.__name__} registers method(s) {clashes} whose names clash with "
            f"WorkerGroup.{clashes[0]}; rename the worker method(s)"
        )


def _send_data(
    executor: Executor, per_rank_args: tuple[Any, ...], per_rank_kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any], list[RemoteRows]]:
    """Lazy DataProto arguments as row requests (or driver-read rows), counting what the driver sends."""
    columns = [*per_rank_args, *per_rank_kwargs.values()]
    if not columns or not all(isinstance(c, (list, tuple)) for c in columns):
        return per_rank_args, per_rank_kwargs, []  # malformed: _make_call says what the dispatch returned
    sent, sources = send_lazy_arguments(executor, columns)
    n = len(per_rank_args)
    return tuple(sent[:n]), dict(zip(per_rank_kwargs, sent[n:], strict=True)), sources


def _materialize(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    def get(v: Any) -> Any:
        return v.get() if isinstance(v, CallFuture) else v

    return tuple(get(a) for a in args), {k: get(v) for k, v in kwargs.items()}


def _plain(value: Any) -> Any:
    """Plain dicts/lists from any mapping (OmegaConf DictConfig included)."""
    if isinstance(value, Mapping) or (hasattr(value, "keys") and hasattr(value, "__getitem__")):
        return {str(k): _plain(value[k]) for k in value.keys()}
    if isinstance(value, (list, tuple)) or type(value).__name__ == "ListConfig":
        return [_plain(v) for v in value]
    return value


@atexit.register
def _shutdown_live_groups() -> None:
    for group in list(_live_groups):
        try:
            group.shutdown()
        except Exception:  # noqa: BLE001, S110 - best effort at exit
            pass
