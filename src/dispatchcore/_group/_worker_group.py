"""``WorkerGroup``: the driver's handle on N ranks hosting one worker class, the same on every backend."""

from __future__ import annotations

import atexit
import itertools
import os
import threading
import weakref
from collections.abc import Iterable, Mapping
from typing import Any, Generic, TypeVar, cast

from .._base import (
    DispatchAttributeError,
    DispatchError,
    DispatchKeyError,
    DispatchTypeError,
    DispatchValueError,
    RegistrationError,
    did_you_mean,
)
from .._dispatch import Registration, collect_list, dispatch_all_to_all, registered_methods
from .._rows import DEFAULT_BUDGET, RowLedger
from .._spi import Call, Executor, GroupSpec, Instructions, Operation, get_executor_class
from .._worker import GroupResized, MembershipChange, method_names
from ._bind import bind_call
from ._call_options import check_timeout
from ._config import plain_config, resolve_backend
from ._group_view import select_by_index, select_ranks
from ._membership import CANCEL_GRACE_S, SetupLog, check_on_rank_death
from ._method_proxy import MethodNamespace, proxy_class
from ._plan import build_call
from ._resize import grow, shrink
from ._site import CallSite, SharedRanks, ledger_sender
from ._submit import Submitted, submit

W = TypeVar("W")
R = TypeVar("R")

_live_groups: weakref.WeakSet[WorkerGroup[Any]] = weakref.WeakSet()
_names = itertools.count()
_labels = itertools.count()
#: The mesh query's instructions: the core's operation, not a worker method.
_MESH = Instructions(operation=Operation.MESH)


def _check_world_size(
    executor_cls: type[Executor], backend: str, worker_cls: type, world_size: Any, ranks: Any = None
) -> int:
    if world_size is None and isinstance(ranks, (list, tuple, range)):
        world_size = len(ranks)  # ``ranks=[1, 2]`` places a group of two: its size needs no second saying
    if world_size is None:
        world_size = executor_cls.launch_world_size()
        if world_size is None:
            raise DispatchValueError(
                f"world_size is required for backend {backend!r} (it is implied only under torchrun); "
                f"pass WorkerGroup({worker_cls.__name__}, world_size=N)"
            )
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise DispatchValueError(f"world_size must be an int >= 1, got {world_size!r}")
    return world_size


def _check_flags(isolate: Any, init_args: Any, lazy: Any, lazy_budget_bytes: Any) -> None:
    if not isinstance(isolate, bool):
        raise DispatchTypeError(f"isolate must be True or False, got {isolate!r}")
    if not isinstance(init_args, (tuple, list)):
        raise DispatchTypeError(f"init_args must be a tuple, got {type(init_args).__name__}")
    if not isinstance(lazy, bool):
        raise DispatchTypeError(f"lazy must be True or False, got {lazy!r}")
    if lazy_budget_bytes is not None and (
        isinstance(lazy_budget_bytes, bool) or not isinstance(lazy_budget_bytes, int) or lazy_budget_bytes < 0
    ):
        raise DispatchValueError(f"lazy_budget_bytes must be a number of bytes >= 0 or None, got {lazy_budget_bytes!r}")


class WorkerGroup(Generic[W]):
    """N ranks hosting ``worker_cls``; one proxy attribute per ``@register`` method."""

    _site: CallSite
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
        cancel_grace: float = CANCEL_GRACE_S,
        **backend_options: Any,
    ) -> None:
        if not isinstance(worker_cls, type):
            raise DispatchTypeError(f"worker_cls must be a class, got {worker_cls!r}")
        name = resolve_backend(backend)
        executor_cls = get_executor_class(name)
        world_size = _check_world_size(executor_cls, name, worker_cls, world_size, backend_options.get("ranks"))
        _check_flags(isolate, init_args, lazy, lazy_budget_bytes)
        check_on_rank_death(on_rank_death, name, executor_cls)
        timeout = check_timeout("call_timeout", call_timeout)
        methods = registered_methods(worker_cls)
        clashes = sorted(set(methods) & _GROUP_ATTRS)
        if clashes:
            raise RegistrationError(
                f"{worker_cls.__name__} registers method(s) {clashes} whose names clash with "
                f"WorkerGroup.{clashes[0]}; rename the worker method(s)"
            )
        self._closed = True  # until the executor is up
        group_name = backend_options.pop("name", None) or f"{worker_cls.__name__}-{os.getpid()}-{next(_names)}"
        spec = GroupSpec(
            worker_cls=worker_cls,
            world_size=world_size,
            init_args=tuple(init_args),
            init_kwargs=dict(init_kwargs or {}),
            isolate=isolate,
            call_timeout=timeout,
            death_timeout=check_timeout("death_timeout", death_timeout, allow_none=False),  # type: ignore[arg-type]
            options=dict(backend_options),
            name=str(group_name),
            methods=method_names(worker_cls),
        )
        executor = executor_cls(spec)
        shared = SharedRanks(
            executor, name, f"{worker_cls.__name__}#{next(_labels)}", lazy, on_rank_death,
            RowLedger(executor, lazy_budget_bytes),
        )  # fmt: skip
        shared.root = weakref.ref(self)
        shared.membership.cancel_grace = check_timeout("cancel_grace", cancel_grace, allow_none=False)  # type: ignore[assignment]
        shared.ledger.send = ledger_sender(shared)
        self._attach(CallSite(shared, tuple(range(world_size)), "", timeout), worker_cls, methods, None)
        _live_groups.add(self)

    def _attach(
        self, site: CallSite, worker_cls: type, methods: dict[str, Registration], parent: WorkerGroup[Any] | None
    ) -> None:
        """Set up a group or a view over ``site`` (the one place a group's fields are set)."""
        self._site = site
        self._worker_cls = worker_cls
        self._methods = methods
        self._parent = parent
        self._mesh_cache: dict[str, list[tuple[int, bool]]] = {}
        self._lock = threading.Lock()
        self._closed = False
        root = parent or self
        if parent is None:
            self._members: weakref.WeakSet[WorkerGroup[Any]] = weakref.WeakSet()
        root._members.add(self)  # a resize points every view at the new world
        for name, registration in methods.items():
            setattr(self, name, proxy_class(name)(self, site, name, registration))
        self.on_bound(parent)

    def on_bound(self, parent: WorkerGroup[Any] | None) -> None:
        """Runs once a group or a view (``parent``: its group, else ``None``) has its proxies bound; for adapters."""

    def _view(self, site: CallSite, worker_cls: type | None = None) -> WorkerGroup[Any]:
        """A view: a group over ``site`` (some of these ranks, or one role of them: ``worker_cls``)."""
        view: WorkerGroup[Any] = type(self).__new__(type(self))
        methods = self._methods if worker_cls is None else registered_methods(worker_cls)
        view._attach(site, worker_cls or self._worker_cls, methods, self._parent or self)
        return view

    @classmethod
    def from_config(cls, config: Mapping[str, Any], worker_cls: type[W], **kwargs: Any) -> WorkerGroup[W]:
        """Build from any mapping with ``backend``, ``world_size`` and a per-backend section; keyword arguments win."""
        if not isinstance(config, Mapping) and not hasattr(config, "get"):
            raise DispatchTypeError(f"config must be a mapping (dict, OmegaConf), got {type(config).__name__}")
        backend = resolve_backend(kwargs.pop("backend", None), config)
        for key in ("world_size", "call_timeout", "death_timeout", "isolate", "init_kwargs"):
            if key not in kwargs and config.get(key) is not None:
                kwargs[key] = plain_config(config.get(key))
        section = config.get(backend)
        options = plain_config(section) if section is not None else {}
        if not isinstance(options, dict):
            raise DispatchTypeError(
                f"config[{backend!r}] must be a mapping of backend options, got {type(section).__name__}"
            )
        return cls(worker_cls, backend=backend, **{**options, **kwargs})

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
            raise DispatchKeyError(f"unknown role(s) {unknown}; this colocated class hosts {sorted(roles)}")
        site = self._site
        return {role: self._view(site.over(prefix=f"{site.prefix}{role}_"), roles[role]) for role in wanted}

    def role(self, name: str, role_cls: type[R]) -> WorkerGroup[R]:
        """Role ``name``'s group, typed (and checked) ``WorkerGroup[role_cls]``: ``wg.role("actor", Actor)``."""
        if not isinstance(role_cls, type):
            raise DispatchError(f"wg.role({name!r}, cls) needs the role's worker class as cls, got {role_cls!r}")
        view = self.spawn([name])[name]
        hosted: type = view.worker_cls
        if not issubclass(hosted, role_cls):
            raise DispatchError(
                f"role {name!r} of {self._worker_cls.__name__} hosts {hosted.__qualname__}, not "
                f"{role_cls.__qualname__}: pass wg.role({name!r}, {hosted.__name__}) (or a base class of it)"
            )
        return cast("WorkerGroup[R]", view)

    def __getitem__(self, index: int | slice) -> WorkerGroup[W]:
        """A view (dispatching for its own size) calling only the ranks ``index`` selects: ``wg[0:2]``, ``wg[3]``."""
        return self._view(self._site.over(select_by_index(self._site.ranks, index)))

    def ranks(self, ranks: Iterable[int]) -> WorkerGroup[W]:
        """A view calling only ``ranks`` (distinct numbers of this group), in the order given."""
        return self._view(self._site.over(select_ranks(self._site.ranks, ranks)))

    @property
    def rank_ids(self) -> tuple[int, ...]:
        """The ranks of the whole group this group calls, in order (``0..world_size-1`` unless a view)."""
        return self._site.ranks

    @property
    def call(self) -> type[W]:
        """The registered methods, typed as the worker class for checkers: ``wg.call.update_actor(batch)``."""
        return cast("type[W]", MethodNamespace(self))

    # -- for executors' adapters (public, so they need nothing private) -------------
    @property
    def executor(self) -> Executor:
        """The executor running this group's ranks (shared by ``spawn``'s views)."""
        return self._site.executor

    @property
    def role_prefix(self) -> str:
        """``"<role>_"`` for a view from :meth:`spawn` (its methods' names on the ranks), else ``""``."""
        return self._site.prefix

    @property
    def setup_log(self) -> SetupLog:
        """The setup calls (``@register(..., setup=True)``) a replacement rank replays, in order."""
        return self._site.shared.membership.setup_log

    @property
    def trace_label(self) -> str:
        """The group's name in traces: its ranks' tracks are ``f"{trace_label} rank {r}"`` (views share it)."""
        return self._site.shared.label

    @property
    def call_site(self) -> CallSite:
        """Where this group's calls go; ``call_site.submit(call)`` sends one of the core's own calls
        (``Instructions.operation``) through the call pipeline, as weight sync's steps go."""
        return self._site

    @property
    def call_timeout(self) -> float | None:
        """The group's default call bound (``None``: calls may run as long as they need)."""
        return self._site.call_timeout

    def replace_rank(self, *ranks: int) -> MembershipChange:
        """Start new processes for ``ranks`` (dead ones, or hung ones: killed first) and rebuild the group.

        Setup calls are replayed and ``Worker.on_membership_change`` runs on
        every rank (``docs/replacing-ranks.md``); backends that cannot raise.
        """
        site = self._site
        if site.shared.closed:
            raise DispatchError(f"{self!r} is shut down; create a new WorkerGroup")
        size = site.world_size
        bad = [r for r in ranks if isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < size]
        if not ranks or bad:
            raise DispatchValueError(f"replace_rank needs rank numbers in 0..{size - 1}, got {list(ranks)}")
        wanted = tuple(sorted({site.ranks[r] for r in ranks}))  # a view's ranks are positions in it
        return site.shared.membership.replace(self._parent or self, wanted)

    def grow(self, count: int, *, sync: Any = None, version: Any = None) -> GroupResized:
        """Add ``count`` ranks between calls (replicas: rollout engines, DP replicas); ``docs/elastic-groups.md``.

        Calls in flight finish first; new ranks are built, replay setup, and
        ``on_membership_change`` runs on every rank.  ``sync``: a
        ``WeightSync`` into this group, run into the new ranks (as ``version``)
        before their first call.  Backends that cannot raise, saying why.
        """
        return grow(self, list((self._parent or self)._members), count, sync, version)

    def shrink(self, *ranks: int | Iterable[int]) -> GroupResized:
        """Remove ``ranks`` (``wg.shrink(3)``, ``wg.shrink([2, 3])``) between calls; the ranks above move down.

        Waits for calls in flight, refuses while lazy results still live on
        ranks that go or move, stops the removed ranks' threads, processes
        or actors (``docs/elastic-groups.md``).
        """
        if len(ranks) == 1 and isinstance(ranks[0], (list, tuple, range)):
            ranks = tuple(ranks[0])
        return shrink(self, list((self._parent or self)._members), ranks)

    def rank_stacks(self, *, all_threads: bool = False, timeout: float = 10.0) -> dict[int, str]:
        """Where each rank is now: the Python stack of the thread running its methods, by rank.

        Answers while a call runs, even blocked in C.  ``all_threads=True``
        gives every thread; a rank silent for ``timeout`` seconds is left out.
        """
        site = self._site
        if site.shared.closed:
            raise DispatchError(f"{self!r} is shut down; create a new WorkerGroup")
        timeout = check_timeout("timeout", timeout, allow_none=False)  # type: ignore[assignment]
        return site.executor.rank_stacks(list(site.ranks), all_threads, timeout)

    def ensure_usable(self) -> None:
        """Raise :class:`DispatchError` if the group is shut down or broken."""
        self._site.check_open(self)

    def _raw_call(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any], rank_zero: bool) -> list[Any]:
        site = self._site
        site.check_open(self)
        per_rank_args, per_rank_kwargs = dispatch_all_to_all(self, *args, **kwargs)  # reads no call context
        bind_call(site, self, name, per_rank_args, per_rank_kwargs, "ALL_TO_ALL")
        call = build_call(
            site, name, "ALL_TO_ALL", per_rank_args, per_rank_kwargs, rank_zero=rank_zero, timeout=site.call_timeout
        )
        return submit(self, site, call).result()

    def _submit_call(self, call: Call, *, settled: bool = False) -> Submitted:
        """``self.call_site.submit(call, self, settled=...)`` (kept for the resize's calls)."""
        return self._site.submit(call, self, settled=settled)

    def execute_all(self, method_name: str, /, *args: Any, **kwargs: Any) -> list[Any]:
        """Run any worker method on every rank (verl's ALL_TO_ALL rule for arguments)."""
        return collect_list(self, self._raw_call(method_name, args, kwargs, rank_zero=False))

    def execute_rank_zero(self, method_name: str, /, *args: Any, **kwargs: Any) -> Any:
        """Run any worker method on rank 0 only and return its value."""
        return self._raw_call(method_name, args, kwargs, rank_zero=True)[0]

    def mesh_ranks(self, mesh_name: str) -> list[tuple[int, bool]]:
        """Each rank's ``(dp_rank, is_collect)`` on ``mesh_name``, asked once (a view's dp ranks numbered from 0)."""
        cached = self._mesh_cache.get(mesh_name)  # a dict read needs no lock; the write below takes it
        if cached is None:
            answers = self._mesh_query(mesh_name)
            cached = [(int(dp), bool(c)) for dp, c in answers]
            if self._site.world_size < (self._parent or self).world_size:
                # A view over some dp ranks splits over those only, renumbered 0..k-1.
                present = {dp: i for i, dp in enumerate(sorted({dp for dp, _ in cached}))}
                cached = [(present[dp], c) for dp, c in cached]
            with self._lock:
                self._mesh_cache[mesh_name] = cached
        return cached

    def _mesh_query(self, mesh_name: str) -> list[Any]:
        """``Operation.MESH`` on every rank: each one's declaration of ``mesh_name`` (its role's, in a role view)."""
        site = self._site
        site.check_open(self)
        if not isinstance(mesh_name, str):
            raise DispatchTypeError(
                f"a mesh name is a string (the one the workers passed to _register_dispatch_collect_info), "
                f"got {mesh_name!r}"
            )
        n = site.world_size
        call = Call(
            f"{site.prefix}<mesh {mesh_name}>", site.ranks, [(site.prefix, mesh_name)] * n, [{} for _ in range(n)],
            site.call_timeout, instructions=_MESH,
        )  # fmt: skip
        return site.submit(call, self).result()

    @property
    def world_size(self) -> int:
        return self._site.world_size

    @property
    def backend(self) -> str:
        """The backend's name, e.g. ``"local"``."""
        return self._site.shared.backend

    @property
    def worker_cls(self) -> type:
        return self._worker_cls

    @property
    def method_names(self) -> list[str]:
        """Names of the registered methods bound on this group."""
        return sorted(self._methods)

    def __getattr__(self, name: str) -> Any:
        worker_cls = self.__dict__.get("_worker_cls")
        if worker_cls is None or name.startswith("_"):  # protocol and private lookups: the plain answer
            raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")
        if callable(getattr(worker_cls, name, None)):
            raise DispatchAttributeError(
                f"{worker_cls.__name__}.{name} is not decorated with @register, so the group has no "
                f"proxy for it. Decorate it with @register(dispatch_mode=...) or call "
                f"wg.execute_all({name!r}, ...)"
            )
        known = [*self.__dict__.get("_methods", ()), *(n for n in dir(type(self)) if not n.startswith("_"))]
        raise DispatchAttributeError(
            f"{worker_cls.__name__} has no @register method {name!r} (nor has the {type(self).__name__} such an "
            f"attribute); its registered methods are {self.method_names}{did_you_mean(name, known)}"
        )

    def shutdown(self) -> None:
        """Release every rank; idempotent; views leave the shared ranks to their parent."""
        if self._closed:
            return
        self._closed = True
        site = self.__dict__.get("_site")
        if site is None:
            return
        site.closed = True
        if self._parent is None:
            site.shared.closed = True
            site.shared.ledger.flush()  # no call follows: the rows released since the last one go now
            site.executor.shutdown()

    def __enter__(self) -> WorkerGroup[W]:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    def __repr__(self) -> str:
        name = self.__dict__.get("_worker_cls", type(None)).__name__
        site = self.__dict__.get("_site")
        if site is None:
            return f"<WorkerGroup {name} (not started)>"
        state = " closed" if self.__dict__.get("_closed") else ""
        if site.ranks != tuple(range(len(site.ranks))):
            state = f" ranks {list(site.ranks)}{state}"
        return f"<WorkerGroup {name} x{site.world_size} on {site.shared.backend!r}{state}>"


_GROUP_ATTRS = frozenset(n for n in dir(WorkerGroup) if not n.startswith("__"))


@atexit.register
def _shutdown_live_groups() -> None:
    for group in list(_live_groups):
        try:
            group.shutdown()
        except Exception:  # noqa: BLE001, S110 - best effort at exit
            pass
