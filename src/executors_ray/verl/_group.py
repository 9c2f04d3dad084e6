"""verl-shaped names over the ray backend; what each of verl's keywords does: docs/porting-from-verl.md."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from dispatchcore import (
    ClassWithInitArgs,
    DispatchTypeError,
    DispatchValueError,
    WorkerGroup,
    create_colocated_worker_raw_cls,
)

from .._detached import detached_world_size
from .._executor import OPTIONS, RayExecutor
from .._pool import RayResourcePool
from ._refs import RefProxy, by_name, gives_refs

_log = logging.getLogger("executors_ray.verl")
_logged: set[str] = set()

#: Attributes a view (``spawn`` role, ``wg[0:2]``) shares with its group.
VERL_ATTRIBUTES = (
    "resource_pool", "device_name", "use_gpu", "profile_steps", "worker_nsight_options", "name_prefix",
    "_ray_wait_register_center_timeout", "fused_worker_used", "ray_cls_with_init",
)  # fmt: skip
#: verl's keywords taken from ``**options`` (see ``_take_verl_keywords``).
VERL_KEYWORDS = ("use_gpu", "profile_steps", "worker_nsight_options", "master_addr", "master_port", "master_port_range")
#: Why a verl keyword does nothing here (said once in the log when given).
NOT_APPLICABLE = {
    "master": "the executor picks the rendezvous itself (rank 0's node, a free port; wg.master_address/master_port)",
    "nsight": "dispatchcore does not start workers under Nsight Systems; profile inside the worker "
    "(torch.cuda.profiler / nsys attached to the Ray worker process)",
}


def log_once(key: str, message: str) -> None:
    """Say ``message`` at WARNING level the first time ``key`` comes up in this process."""
    if key not in _logged:
        _logged.add(key)
        _log.warning(message)


def plain_class(cls: Any) -> type:
    """The Python class behind ``cls``, unwrapping a ``ray.remote`` actor class."""
    inner = getattr(cls, "__ray_actor_class__", None)
    if isinstance(inner, type):
        return inner
    if isinstance(cls, type):
        return cls
    raise DispatchTypeError(f"expected a worker class or a ray.remote(worker class), got {cls!r}")


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
            raise DispatchTypeError(
                f"update_options takes a dict of ActorClass.options(...), got {type(options).__name__}"
            )
        self._options.update(options)

    def set_additional_resource(self, additional_resource: dict[str, Any]) -> None:
        """More ``ActorClass.options(...)`` (verl's method; e.g. ``{"resources": {"my_tag": 1}}``)."""
        if not isinstance(additional_resource, Mapping):
            raise DispatchTypeError(f"set_additional_resource takes a dict, got {type(additional_resource).__name__}")
        self._additional_resource = dict(additional_resource)

    def backend_options(self) -> dict[str, Any]:
        """The ray backend options these actor options amount to (``env``, ``runtime_env``, ``ray_actor_options``).

        A ``runtime_env`` of only ``env_vars`` becomes ``env``: no per-actor runtime env, which costs a process.
        """
        actor = {**self._additional_resource, **self._options}
        out: dict[str, Any] = {}
        runtime_env = actor.pop("runtime_env", None)
        if runtime_env is not None:
            if not isinstance(runtime_env, Mapping):
                raise DispatchTypeError(f"runtime_env must be a dict, got {type(runtime_env).__name__}")
            if set(runtime_env) <= {"env_vars"}:
                out["env"] = dict(runtime_env.get("env_vars") or {})
            else:
                out["runtime_env"] = dict(runtime_env)
        actor.pop("name", None)  # ranks are named by the group (name_prefix)
        if actor:
            out["ray_actor_options"] = actor
        return out

    def __repr__(self) -> str:
        return f"RayClassWithInitArgs({self.cls.__name__})"


class RayWorkerGroup(WorkerGroup[Any]):
    """verl 0.9.1's constructor (every keyword verl passes), attributes and helpers on a ``ray`` WorkerGroup."""

    #: verl's attributes: whether the class came from ``create_colocated_worker_cls_fused``, and the class spec.
    fused_worker_used: bool = False
    ray_cls_with_init: Any = None
    #: verl's: the role a ``spawn`` view is bound to ("" for the group itself).
    sub_cls_name: str = ""
    #: Every keyword the constructor takes through ``**options`` (verl's, the core's, the ray backend's).
    ACCEPTED_KEYWORDS: frozenset[str] = frozenset(
        {*VERL_KEYWORDS, *OPTIONS, "call_timeout", "death_timeout", "isolate", "on_rank_death", "lazy"}
        | {"lazy_budget_bytes", "env", "name"}
    )

    def __init__(
        self,
        resource_pool: RayResourcePool | None = None,
        ray_cls_with_init: Any = None,
        bin_pack: bool = True,
        name_prefix: str | None = None,
        detached: bool = False,
        worker_names: Sequence[str] | None = None,
        worker_handles: Sequence[Any] | None = None,
        ray_wait_register_center_timeout: float = 300,
        *,
        world_size: int | None = None,
        device_name: str = "cuda",
        worker_env: Mapping[str, Any] | None = None,
        **options: Any,
    ) -> None:
        if ray_cls_with_init is None:
            raise DispatchTypeError("RayWorkerGroup needs ray_cls_with_init (a RayClassWithInitArgs or a worker class)")
        spec = ray_cls_with_init
        spec = spec if isinstance(spec, ClassWithInitArgs) else RayClassWithInitArgs(spec)
        self._take_verl_keywords(resource_pool, bin_pack, device_name, ray_wait_register_center_timeout, options)
        self._merge_actor_options(spec, worker_env, options)
        self.fused_worker_used = bool(getattr(spec, "fused_worker_used", False))
        self.ray_cls_with_init = spec
        self.name_prefix = name_prefix
        if resource_pool is not None:
            if world_size is not None and world_size != resource_pool.world_size:
                raise DispatchValueError(f"world_size={world_size} but the pool has {resource_pool.world_size} ranks")
            world_size = resource_pool.world_size
            options["resource_pool"] = resource_pool
        if worker_handles is not None:
            handles = list(worker_handles)
            if world_size is not None and world_size != len(handles):
                raise DispatchValueError(f"world_size={world_size} but {len(handles)} worker_handles were given")
            world_size, options["actors"] = len(handles), handles
        elif worker_names is not None:
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

    def _take_verl_keywords(
        self, pool: RayResourcePool | None, bin_pack: bool, device_name: str, wait: float, options: dict[str, Any]
    ) -> None:
        """Take verl's keywords out of ``options``: applied, or recorded and logged once."""
        self.resource_pool = pool
        self.device_name = device_name
        self.use_gpu = bool(options.pop("use_gpu", pool.use_gpu if pool is not None else False))
        self.profile_steps = options.pop("profile_steps", None)
        self.worker_nsight_options = options.pop("worker_nsight_options", None)
        self._ray_wait_register_center_timeout = wait
        options.setdefault("start_timeout", float(wait))
        if pool is not None:
            if self.use_gpu and not pool.use_gpu:
                raise DispatchValueError(
                    "use_gpu=True but the resource pool was made with use_gpu=False; make the pool with "
                    "use_gpu=True, or pass use_gpu=False"
                )
            if not self.use_gpu and pool.use_gpu:
                options.setdefault("num_gpus", 0)  # verl: a GPU pool's actors ask no GPU when use_gpu=False
            if not bin_pack:
                pool.prefer_strategy("PACK")
        elif not bin_pack:
            log_once("bin_pack", "RayWorkerGroup(bin_pack=False) without a resource_pool: nothing to pack; ignored")
        if device_name not in ("cuda", "cpu"):
            log_once(
                f"device:{device_name}",
                f"RayWorkerGroup(device_name={device_name!r}): dispatchcore asks Ray for its 'GPU' resource and "
                "sets LOCAL_RANK; the device itself is the worker's to select (recorded as wg.device_name)",
            )
        for key in ("master_addr", "master_port", "master_port_range"):
            if options.pop(key, None) is not None:
                log_once(key, f"RayWorkerGroup({key}=...) is not applicable: {NOT_APPLICABLE['master']}")
        if self.worker_nsight_options is not None:
            log_once(
                "nsight", f"RayWorkerGroup(worker_nsight_options=...) is not applicable: {NOT_APPLICABLE['nsight']}"
            )

    @staticmethod
    def _merge_actor_options(spec: Any, worker_env: Mapping[str, Any] | None, options: dict[str, Any]) -> None:
        """Fold the class's Ray actor options and ``worker_env`` into the backend options."""
        from_class = spec.backend_options() if isinstance(spec, RayClassWithInitArgs) else {}
        if "ray_actor_options" in from_class:
            options["ray_actor_options"] = {**from_class["ray_actor_options"], **options.get("ray_actor_options", {})}
        if "runtime_env" in from_class and options.get("runtime_env") is None:
            options["runtime_env"] = from_class["runtime_env"]
        if worker_env is not None and not isinstance(worker_env, Mapping):
            raise DispatchTypeError(
                f"worker_env must be a dict of variable names to values, got {type(worker_env).__name__}"
            )
        env = {**from_class.get("env", {}), **(options.get("env") or {}), **(worker_env or {})}
        if env:
            options["env"] = env

    # -- what verl's trainer reads on groups (groups, spawn roles and views alike) ----------
    def on_bound(self, parent: Any) -> None:
        """Once the core bound a group or view: verl's attributes, ref-returning proxies for non-blocking methods."""
        super().on_bound(parent)
        #: verl's cache: mesh name -> each rank's dp rank on it (filled by the trainer or nd dispatch).
        self._dispatch_info: dict[str, list[int]] = {}
        if parent is not None:  # a view: verl's attributes are the root group's
            self.__dict__.update({key: parent.__dict__[key] for key in VERL_ATTRIBUTES if key in parent.__dict__})
            self.__dict__["sub_cls_name"] = self.role_prefix[:-1]
        for name in self.method_names:
            proxy = getattr(self, name)
            if gives_refs(proxy.registration):
                setattr(self, name, RefProxy(self, name, proxy.registration, proxy))

    def _query_dispatch_info(self, mesh_name: str) -> list[int]:
        """Each rank's dp rank on ``mesh_name`` (verl's name; asked once, cached by the core)."""
        return [dp for dp, _ in self.mesh_ranks(mesh_name)]

    @property
    def master_address(self) -> str | None:
        """Rank 0's node address, the torch.distributed rendezvous (verl's attribute)."""
        return self._rank_zero_info("ip")

    @property
    def master_port(self) -> str | None:
        """The rendezvous port the executor picked on rank 0's node (verl's attribute)."""
        return self._rank_zero_info("port")

    def _rank_zero_info(self, key: str) -> str | None:
        infos = self._ray()._rank_actors.infos
        return str(infos[0][key]) if infos else None

    @property
    def _workers(self) -> list[Any]:
        """verl's private list of actor handles (read by some of verl's workers)."""
        return self.workers

    @property
    def _world_size(self) -> int:
        return self.world_size

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
                raise DispatchTypeError("from_detached needs name_prefix (the detached group's name)")
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
        """Set each role's group (:meth:`spawn`'s views) as an attribute: ``wg.actor.add(x)`` (verl's method)."""
        views = self.spawn(prefix_set)
        for role in views:
            if hasattr(type(self), role) or role in self.__dict__:
                raise DispatchValueError(
                    f"fuse: role {role!r} would hide {type(self).__name__}.{role}; rename the role, or use "
                    f"wg.spawn({sorted(views)})[{role!r}]"
                )
        for role, view in views.items():
            setattr(self, role, view)

    def _ray(self) -> RayExecutor:
        executor = self.executor
        if not isinstance(executor, RayExecutor):
            raise DispatchTypeError(f"RayWorkerGroup runs on the ray backend, not {executor.name!r}")
        return executor

    @property
    def workers(self) -> list[Any]:
        """The Ray actor handles, in rank order (a view's ranks only)."""
        return [self._ray().actor(r) for r in self.rank_ids]

    @property
    def worker_names(self) -> list[str]:
        return [self._ray().actor_name(r) for r in self.rank_ids]

    def execute_all_sync(self, method_name: str, *args: Any, **kwargs: Any) -> list[Any]:
        """Run ``method_name`` on every rank and wait (verl's ALL_TO_ALL argument rule)."""
        return self.execute_all(method_name, *args, **kwargs)

    def execute_all_async(self, method_name: str, *args: Any, **kwargs: Any) -> list[Any]:
        """Start ``method_name`` on every rank; Ray ``ObjectRef`` s to ``ray.get`` (as verl)."""
        refs: list[Any] = by_name(self, method_name, args, kwargs, rank_zero=False)
        return refs

    def execute_rank_zero_sync(self, method_name: str, *args: Any, **kwargs: Any) -> Any:
        return self.execute_rank_zero(method_name, *args, **kwargs)

    def execute_rank_zero_async(self, method_name: str, *args: Any, **kwargs: Any) -> Any:
        return by_name(self, method_name, args, kwargs, rank_zero=True)


def create_colocated_worker_cls_fused(class_dict: Mapping[str, Any]) -> RayClassWithInitArgs:
    """verl's helper: a fused class of ``class_dict``'s roles for ``RayWorkerGroup`` (then ``spawn``/``fuse``)."""
    spec = RayClassWithInitArgs(create_colocated_worker_raw_cls(class_dict))
    spec.fused_worker_used = True
    return spec
