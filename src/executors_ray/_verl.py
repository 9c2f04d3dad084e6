"""verl-shaped names over the ray backend, so a verl driver ports by changing imports.

``RayClassWithInitArgs(cls, *args, **kwargs)`` (``cls`` may be a plain class
or verl's ``ray.remote(cls)``), ``RayWorkerGroup(resource_pool,
ray_cls_with_init, worker_env=...)`` with ``execute_all_sync`` /
``execute_all_async`` / ``execute_rank_zero*``, ``from_detached`` and
``fuse``, and ``create_colocated_worker_cls_fused``.  Everything else
(dispatch, ``spawn``, futures, the colocated classes) is the core's.

Worker environment: ``worker_env={...}`` and the ``env_vars`` of a
``runtime_env`` given through ``RayClassWithInitArgs.update_options`` are
set in each worker before its ``__init__`` (no per-actor ``runtime_env``,
which would cost every actor a fresh Ray worker process); the variables the
executor sets per rank (``RANK``, ``WORLD_SIZE``, ``MASTER_*``,
``LOCAL_*``, ``RAY_LOCAL_RANK``, ``RAY_LOCAL_WORLD_SIZE``) are refused with
a ``ValueError`` naming them, as verl does.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from dispatchcore import ClassWithInitArgs, WorkerGroup, create_colocated_worker_raw_cls

from ._detached import detached_world_size
from ._executor import RayExecutor
from ._pool import RayResourcePool


def plain_class(cls: Any) -> type:
    """The Python class behind ``cls``, unwrapping a ``ray.remote`` actor class."""
    inner = getattr(cls, "__ray_actor_class__", None)
    if isinstance(inner, type):
        return inner
    if isinstance(cls, type):
        return cls
    raise TypeError(f"expected a worker class or a ray.remote(worker class), got {cls!r}")


class RayClassWithInitArgs(ClassWithInitArgs):
    """A worker class plus its constructor arguments (verl's name)."""

    #: verl's flag for a class from ``create_colocated_worker_raw_cls``; ``fuse``/``spawn`` need no flag here.
    fused_worker_used: bool = False

    def __init__(self, cls: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(plain_class(cls), *args, **kwargs)
        self._options: dict[str, Any] = {}
        self._additional_resource: dict[str, Any] = {}

    def update_options(self, options: dict[str, Any]) -> None:
        """Extra ``ActorClass.options(...)`` for every rank (verl's method)."""
        if not isinstance(options, Mapping):
            raise TypeError(f"update_options takes a dict of ActorClass.options(...), got {type(options).__name__}")
        self._options.update(options)

    def set_additional_resource(self, additional_resource: dict[str, Any]) -> None:
        """More ``ActorClass.options(...)`` (verl's method; e.g. ``{"resources": {"my_tag": 1}}``)."""
        if not isinstance(additional_resource, Mapping):
            raise TypeError(f"set_additional_resource takes a dict, got {type(additional_resource).__name__}")
        self._additional_resource = dict(additional_resource)

    def backend_options(self) -> dict[str, Any]:
        """The ray backend options these actor options amount to (``env``, ``runtime_env``, ``ray_actor_options``).

        A ``runtime_env`` holding only ``env_vars`` becomes ``env`` (set in
        the worker, no per-actor runtime env); any other ``runtime_env`` is
        passed to Ray as given.
        """
        actor = {**self._additional_resource, **self._options}
        out: dict[str, Any] = {}
        runtime_env = actor.pop("runtime_env", None)
        if runtime_env is not None:
            if not isinstance(runtime_env, Mapping):
                raise TypeError(f"runtime_env must be a dict, got {type(runtime_env).__name__}")
            env_vars = runtime_env.get("env_vars") or {}
            if set(runtime_env) <= {"env_vars"}:
                out["env"] = dict(env_vars)
            else:
                out["runtime_env"] = dict(runtime_env)
        actor.pop("name", None)  # ranks are named by the group (name_prefix)
        if actor:
            out["ray_actor_options"] = actor
        return out

    def __repr__(self) -> str:
        return f"RayClassWithInitArgs({self.cls.__name__})"


class RayWorkerGroup(WorkerGroup[Any]):
    """verl's constructor and helpers on top of :class:`~dispatchcore.WorkerGroup` (backend ``ray``)."""

    #: verl's attributes: whether the class came from ``create_colocated_worker_cls_fused``, and the class spec.
    fused_worker_used: bool = False
    ray_cls_with_init: Any = None

    def __init__(
        self,
        resource_pool: RayResourcePool | None = None,
        ray_cls_with_init: Any = None,
        bin_pack: bool = True,
        name_prefix: str | None = None,
        detached: bool = False,
        worker_names: Sequence[str] | None = None,
        world_size: int | None = None,
        device_name: str = "cuda",
        worker_env: Mapping[str, Any] | None = None,
        **options: Any,
    ) -> None:
        if ray_cls_with_init is None:
            raise TypeError("RayWorkerGroup needs ray_cls_with_init (a RayClassWithInitArgs or a worker class)")
        spec = (
            ray_cls_with_init
            if isinstance(ray_cls_with_init, ClassWithInitArgs)
            else (RayClassWithInitArgs(ray_cls_with_init))
        )
        from_class = spec.backend_options() if isinstance(spec, RayClassWithInitArgs) else {}
        if "ray_actor_options" in from_class:
            options["ray_actor_options"] = {**from_class["ray_actor_options"], **options.get("ray_actor_options", {})}
        if "runtime_env" in from_class and options.get("runtime_env") is None:
            options["runtime_env"] = from_class["runtime_env"]
        if worker_env is not None and not isinstance(worker_env, Mapping):
            raise TypeError(f"worker_env must be a dict of variable names to values, got {type(worker_env).__name__}")
        env = {**from_class.get("env", {}), **(options.get("env") or {}), **(worker_env or {})}
        if env:
            options["env"] = env
        self.fused_worker_used = bool(getattr(spec, "fused_worker_used", False))
        self.ray_cls_with_init = spec
        if resource_pool is not None:
            if world_size is not None and world_size != resource_pool.world_size:
                raise ValueError(f"world_size={world_size} but the pool has {resource_pool.world_size} ranks")
            world_size = resource_pool.world_size
            options["resource_pool"] = resource_pool
        if worker_names is not None:
            options["attach"] = True
            world_size = len(worker_names) if world_size is None else world_size
        if name_prefix:
            options["name"] = name_prefix
        super().__init__(
            spec.cls,
            world_size,
            backend="ray",
            init_args=tuple(spec.args),
            init_kwargs=dict(spec.kwargs),
            detached=detached,
            **options,
        )

    @classmethod
    def from_detached(
        cls,
        name_prefix: str | None = None,
        worker_names: Sequence[str] | None = None,
        ray_cls_with_init: Any = None,
        world_size: int | None = None,
        **options: Any,
    ) -> RayWorkerGroup:
        """Attach to a detached group another driver made (by its ``name_prefix``)."""
        if name_prefix is None:
            if not worker_names:
                raise TypeError("from_detached needs name_prefix (the detached group's name)")
            name_prefix = str(worker_names[0]).rsplit("-rank", 1)[0]
        if world_size is None:
            world_size = (
                len(worker_names) if worker_names else detached_world_size(name_prefix, options.get("namespace"))
            )
        return cls(
            ray_cls_with_init=ray_cls_with_init, name_prefix=name_prefix, world_size=world_size, attach=True, **options
        )

    # -- verl's helpers ------------------------------------------------------------
    def fuse(self, prefix_set: Iterable[str]) -> None:
        """Set each role's group of a fused or colocated class as an attribute: ``wg.actor.add(x)`` (verl's method).

        The roles' groups share these ranks (they are :meth:`spawn`'s views);
        the class's own methods stay callable on ``wg`` itself.
        """
        views = self.spawn(prefix_set)
        for role in views:
            if hasattr(type(self), role) or role in self.__dict__:
                raise ValueError(
                    f"fuse: role {role!r} would hide {type(self).__name__}.{role}; rename the role, or use "
                    f"wg.spawn({sorted(views)})[{role!r}]"
                )
        for role, view in views.items():
            setattr(self, role, view)

    def _ray(self) -> RayExecutor:
        """The :class:`RayExecutor` behind this group (and every view ``spawn`` made of it)."""
        executor = self.executor
        if not isinstance(executor, RayExecutor):
            raise TypeError(f"RayWorkerGroup runs on the ray backend, not {executor.name!r}")
        return executor

    @property
    def workers(self) -> list[Any]:
        """The Ray actor handles, in rank order (a view's ranks only)."""
        actors = self._ray().actors
        return [actors[r] for r in self.rank_ids]

    @property
    def worker_names(self) -> list[str]:
        return [self._ray().actor_name(r) for r in self.rank_ids]

    def execute_all_sync(self, method_name: str, *args: Any, **kwargs: Any) -> list[Any]:
        """Run ``method_name`` on every rank and wait (verl's ALL_TO_ALL argument rule)."""
        return self.execute_all(method_name, *args, **kwargs)

    def execute_all_async(self, method_name: str, *args: Any, **kwargs: Any) -> list[Any]:
        """Start ``method_name`` on every rank; Ray ``ObjectRef`` s to ``ray.get`` (as verl)."""
        return self._plain_refs(method_name, args, kwargs, ranks=self.rank_ids)

    def execute_rank_zero_sync(self, method_name: str, *args: Any, **kwargs: Any) -> Any:
        return self.execute_rank_zero(method_name, *args, **kwargs)

    def execute_rank_zero_async(self, method_name: str, *args: Any, **kwargs: Any) -> Any:
        return self._plain_refs(method_name, args, kwargs, ranks=self.rank_ids[:1])[0]

    def _plain_refs(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any], ranks: Any) -> list[Any]:
        self.ensure_usable()
        executor, method = self._ray(), self.role_prefix + method
        n = self.world_size
        values = list(args) + list(kwargs.values())
        split = bool(values) and all(isinstance(v, list) and len(v) == n for v in values)
        refs = []
        for position, rank in enumerate(ranks):  # split lists are indexed by position in this (view) group
            a = tuple(v[position] for v in args) if split else args
            kw = {k: v[position] for k, v in kwargs.items()} if split else kwargs
            refs.append(executor.actor(rank).call_plain.remote(method, *a, **kw))
        return refs


def create_colocated_worker_cls_fused(class_dict: Mapping[str, Any]) -> RayClassWithInitArgs:
    """verl's helper: a fused class of ``class_dict``'s roles for ``RayWorkerGroup`` (then ``spawn``/``fuse``)."""
    spec = RayClassWithInitArgs(create_colocated_worker_raw_cls(class_dict))
    spec.fused_worker_used = True
    return spec
