"""verl-shaped names over the ray backend, so a verl driver ports by changing imports.

``RayClassWithInitArgs(cls, *args, **kwargs)`` (``cls`` may be a plain class
or verl's ``ray.remote(cls)``), ``RayWorkerGroup(resource_pool,
ray_cls_with_init)`` with ``execute_all_sync`` / ``execute_all_async`` /
``execute_rank_zero*`` and ``from_detached``.  Everything else (dispatch,
``spawn``, futures) is the core :class:`~dispatchcore.WorkerGroup`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dispatchcore import ClassWithInitArgs, WorkerGroup

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

    def __init__(self, cls: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(plain_class(cls), *args, **kwargs)
        self._options: dict[str, Any] = {}

    def update_options(self, options: dict[str, Any]) -> None:
        """Extra ``ActorClass.options(...)`` for every rank (verl's method)."""
        self._options.update(options)

    def __repr__(self) -> str:
        return f"RayClassWithInitArgs({self.cls.__name__})"


class RayWorkerGroup(WorkerGroup[Any]):
    """verl's constructor and helpers on top of :class:`~dispatchcore.WorkerGroup` (backend ``ray``)."""

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
        **options: Any,
    ) -> None:
        if ray_cls_with_init is None:
            raise TypeError("RayWorkerGroup needs ray_cls_with_init (a RayClassWithInitArgs or a worker class)")
        spec = (
            ray_cls_with_init
            if isinstance(ray_cls_with_init, ClassWithInitArgs)
            else (RayClassWithInitArgs(ray_cls_with_init))
        )
        extra = dict(getattr(spec, "_options", {}) or {})
        if extra:
            options["ray_actor_options"] = {**extra, **options.get("ray_actor_options", {})}
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
    def _ray(self) -> RayExecutor:
        """The :class:`RayExecutor` behind this group (and every view ``spawn`` made of it)."""
        executor = self.executor
        if not isinstance(executor, RayExecutor):
            raise TypeError(f"RayWorkerGroup runs on the ray backend, not {executor.name!r}")
        return executor

    @property
    def workers(self) -> list[Any]:
        """The Ray actor handles, in rank order."""
        return self._ray().actors

    @property
    def worker_names(self) -> list[str]:
        return [self._ray().actor_name(r) for r in range(self.world_size)]

    def execute_all_sync(self, method_name: str, *args: Any, **kwargs: Any) -> list[Any]:
        """Run ``method_name`` on every rank and wait (verl's ALL_TO_ALL argument rule)."""
        return self.execute_all(method_name, *args, **kwargs)

    def execute_all_async(self, method_name: str, *args: Any, **kwargs: Any) -> list[Any]:
        """Start ``method_name`` on every rank; Ray ``ObjectRef`` s to ``ray.get`` (as verl)."""
        return self._plain_refs(method_name, args, kwargs, ranks=range(self.world_size))

    def execute_rank_zero_sync(self, method_name: str, *args: Any, **kwargs: Any) -> Any:
        return self.execute_rank_zero(method_name, *args, **kwargs)

    def execute_rank_zero_async(self, method_name: str, *args: Any, **kwargs: Any) -> Any:
        return self._plain_refs(method_name, args, kwargs, ranks=[0])[0]

    def _plain_refs(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any], ranks: Any) -> list[Any]:
        self.ensure_usable()
        executor, method = self._ray(), self.role_prefix + method
        n = self.world_size
        values = list(args) + list(kwargs.values())
        split = bool(values) and all(isinstance(v, list) and len(v) == n for v in values)
        refs = []
        for rank in ranks:
            a = tuple(v[rank] for v in args) if split else args
            kw = {k: v[rank] for k, v in kwargs.items()} if split else kwargs
            refs.append(executor.actor(rank).call_plain.remote(method, *a, **kw))
        return refs
