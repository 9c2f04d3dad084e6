"""``RayExecutor``: backend ``"ray"``, one named Ray actor per rank, each serving the core's lane.

The core's :class:`~dispatchcore.executor.LaneExecutor` runs the calls
(submit, cancel, stacks, liveness); this backend only starts and stops the
actors, offers the object store as the lane's bulk path (``_bulk``) and
says when an actor died.  Futures and lazy rows move actor to actor
(docs/executor-contract.md, docs/lazy-results.md).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, ClassVar

from dispatchcore import DispatchError, DispatchTypeError, DispatchValueError, WorkerDiedError
from dispatchcore.executor import (
    COLLECTIVE_STORE_ENV,
    LOOPBACK,
    Call,
    CallHandle,
    ChunkPlan,
    GroupSpec,
    LaneAddress,
    LaneCallHandle,
    LaneExecutor,
    ResultShape,
    check_options,
    lane_secret,
    local_ranks,
    rank_environment,
)

from . import _grow
from ._actor import actor_class
from ._bulk import DriverBulk, KeptResult
from ._lane_setup import inline_bytes, lane_host, refuse_ray_client, refuse_removed
from ._pool import PlacementTimeoutError, RayResourcePool
from ._rank_actors import RankActors
from ._rows import RowAddress
from ._runtime import DETACHED_NAMESPACE, ensure_ray, in_session, session_key
from ._store_server import outlive, serve_store
from ._tags import BESIDE_GROUP, CONTROL_GROUP, LANE_GROUP, Forwarded

#: Why a group's ranks are gone once its Ray session ended.
SESSION_ENDED = "its Ray session ended (ray.shutdown()): the group closed with it; create a new group"

#: Backend options and their defaults (``WorkerGroup(..., backend="ray", **options)``).
OPTIONS: dict[str, Any] = {
    "address": None,  # Ray address to connect to when Ray is not initialised (else RAY_ADDRESS)
    "num_cpus": None,  # CPUs of a local Ray this group starts (ray.init(num_cpus=...))
    "resource_pool": None,  # a RayResourcePool to place the ranks on
    "num_gpus": None,  # GPUs per worker (fractions allowed); default: pool share or 0
    "cpus_per_worker": None,  # CPUs each actor reserves without a pool (default 0)
    "env": None,  # extra environment variables for every worker
    "runtime_env": None,  # per-actor Ray runtime_env (slows actor start-up; only if asked)
    "ray_actor_options": None,  # anything else for ActorClass.options(...)
    "detached": False,  # actors outlive this driver; attach with attach_detached(name, ...)
    "namespace": None,  # Ray namespace of the actors (detached groups: "dispatchcore")
    "attach": False,  # attach to the running detached group called `name`
    "actors": None,  # attach to these running rank actors (verl's worker_handles): rank i is the i-th; never killed
    "start_timeout": 300.0,  # bound on placing the actors and on building the workers
    "poll_interval": None,  # cap on the seconds between liveness checks (default: the core's)
    "spare_ranks": 0,  # actors started ahead, to replace dead ranks without waiting for a process
    "lane_inline_bytes": None,  # values and results up to this size ride the lane, larger ones the object store
}


class RayExecutor(LaneExecutor):
    """Backend ``"ray"``: each rank is a named Ray actor (see the module docstring)."""

    name: ClassVar[str] = "ray"
    extra: ClassVar[str | None] = "ray"
    requires: ClassVar[tuple[str, ...]] = ("ray",)

    def __init__(self, spec: GroupSpec) -> None:
        opts = self.options = check_options(self.name, refuse_removed(spec.options), OPTIONS)
        self._env = _user_env(opts["env"])
        self._pool: RayResourcePool | None = opts["resource_pool"]
        if self._pool is not None and not isinstance(self._pool, RayResourcePool):
            raise DispatchTypeError(f"resource_pool must be a RayResourcePool, got {type(self._pool).__name__}")
        self.poll_interval = None if opts["poll_interval"] is None else float(opts["poll_interval"])
        self._start_timeout = float(opts["start_timeout"])
        self._detached = bool(opts["detached"]) or bool(opts["attach"]) or opts["actors"] is not None
        self._namespace = opts["namespace"] or (DETACHED_NAMESPACE if self._detached else None)
        self._spare_count = _spare_count(opts["spare_ranks"], self._pool is not None, self._detached)
        #: Started actors with no rank yet: (actor, its describe() answer, its name), oldest first.
        self._spares: list[tuple[Any, Any, str]] = []
        self._spare_names = (f"{spec.name}-spare{i}" for i in itertools.count())
        self._actor_opts: list[dict[str, Any]] = []
        #: dispatchcore.collective's store for this group and its address.
        self._collective: tuple[Any, str] | None = None
        self._pool_acquired = False
        self._lane_inline = inline_bytes(opts["lane_inline_bytes"])
        refuse_ray_client(opts["address"])  # its actors could never reach this driver's lane
        #: All that its call handles see of the group (kept current here, in place; its Ray once connected).
        self._rank_actors = RankActors(
            ray=None,
            job_id="",
            death_timeout=spec.death_timeout,
            isolate=spec.isolate,
            mark_broken=self.mark_broken,
            names=[f"{spec.name}-rank{rank}" for rank in range(spec.world_size)],
        )
        self._bulk = DriverBulk(self._rank_actors, self._lane_inline)
        # Pickles the worker class and init arguments before Ray or any actor starts (refused with nothing sent).
        super().__init__(spec, bulk=self._bulk)
        self._row_addresses: dict[int, RowAddress] = {}
        #: Ray's actor ids of an attached detached group (a launched one has them in its ``RankActors.infos``).
        self._attached_ids: list[str] = []
        #: Each rank's running ``serve_lane`` task: it fails when the actor dies.
        self._serve_refs: dict[int, Any] = {}
        #: Each launched rank's environment, for :meth:`launch_ranks` (``None``: attached actors keep theirs).
        self._launch_env: list[dict[str, str]] | None = None
        #: Where the lane listens, once the actors' nodes are known (``_use_lane``).
        self._lane_host: str | None = None
        self.lane_reason_wait = spec.death_timeout  # a lost node is known only after Ray's health checks
        self._ray_key = ""
        #: The Ray node id of this driver: the ranks there are the processes whose end the store awaits.
        self._driver_node: str | None = None
        try:
            self.ray = self._rank_actors.ray = ensure_ray(opts)
            #: Which Ray this group's references belong to (a new one after ``ray.shutdown()``/``init``).
            self.job_id = self._rank_actors.job_id = self.ray.get_runtime_context().get_job_id()
            #: This driver's Ray session, as row addresses name it; a group whose session ended closes quietly.
            self._ray_key = session_key(self.ray)
            if opts["actors"] is None and not opts["attach"]:
                self._launch()
            else:
                self._attach(None if opts["actors"] is None else list(opts["actors"]))
        except BaseException:
            self.shutdown()
            raise

    # -- start-up ----------------------------------------------------------------
    def _launch(self) -> None:
        group, deadline = self._rank_actors, time.monotonic() + self._start_timeout
        self._actor_opts = self._actor_options()
        group.actors.extend(actor_class().options(**options).remote() for options in self._actor_opts)
        self._add_spares(self._spare_count)
        group.infos = self._wait(
            [a.describe.remote(rank == 0) for rank, a in enumerate(group.actors)], deadline, "place and start"
        )
        self._open_ranks(range(self.spec.world_size), self._rank_env(group.infos))

    def _open_ranks(self, ranks: Sequence[int], env: list[dict[str, str]]) -> None:
        """Hand ``ranks``' actors the lane, then build their workers there (each step within ``start_timeout``)."""
        here = self._driver_node = self.ray.get_runtime_context().get_node_id()
        self._bulk.bundle = all(info["node_id"] == here for info in self._rank_actors.infos)
        self._launch_env = env
        self._join_lane(ranks)
        self.lane.start(tuple(ranks), self.boot, self.spec.world_size, self._start_timeout)

    # -- the lane ------------------------------------------------------------------
    def _use_lane(self) -> None:
        """The core's lane, listening where every actor reaches it (made once their nodes are known)."""
        if self._lane_host is not None:
            return
        self.lane_host = self._lane_host = lane_host(self.ray, self._rank_actors.infos)  # before the lane is made

    def _join_lane(self, ranks: Sequence[int]) -> None:
        """Have ``ranks``' actors serve the lane, within ``start_timeout``; the group cannot start without it."""
        self._use_lane()
        try:
            self.lane.join(tuple(ranks), functools.partial(self.launch_ranks, ranks), self._start_timeout)
        except OSError as exc:
            raise DispatchError(
                f"ray group {self.spec.name!r}: the driver could not open its control lane on {self.lane.host} "
                f"({type(exc).__name__}: {exc}); every call goes by the lane, so the group cannot start"
            ) from exc
        except DispatchError as exc:
            names = [self._rank_actors.names[rank] for rank in ranks]
            raise DispatchError(
                f"ray group {self.spec.name!r}: the actors of rank(s) {list(ranks)} ({names}) could not reach the "
                f"driver's control lane on {self.lane.host} ({exc}); every call goes by the lane, so the group "
                "cannot start: let the actors' nodes open TCP connections to this driver (a firewall between them?)"
            ) from exc

    def launch_ranks(self, ranks: Sequence[int], address: LaneAddress) -> None:
        """One task per rank actor serving the lane: on its method thread, or beside its own group's lane."""
        spec, actors, env, encoded = self.spec, self._rank_actors.actors, self._launch_env, address.encode()
        secret = lane_secret()  # with the Ray call, which Ray's own authentication guards (docs/security.md)
        for rank in ranks:
            if self.options["actors"] is not None:  # running actors of another group, whose lane may be up
                task = actors[rank].serve_beside.options(concurrency_group=BESIDE_GROUP)
                self._serve_refs[rank] = task.remote(encoded, rank, self._lane_inline, self._start_timeout, secret)
            else:
                rank_env = None if env is None else env[rank]
                task = actors[rank].serve_lane.options(concurrency_group=LANE_GROUP)
                self._serve_refs[rank] = task.remote(
                    encoded,
                    rank,
                    rank_env,
                    spec.name,
                    spec.death_timeout,
                    self._lane_inline,
                    self._start_timeout,
                    secret,
                )

    def rank_dead(self, rank: int) -> str | None:
        """Ray's word that rank ``rank``'s actor is gone: its ``serve_lane`` task failed (polled, never waits).

        Once this group's Ray session ended (``ray.shutdown()``), every rank is gone and Ray is not asked.
        """
        if not in_session(self.ray, self._ray_key):
            self._session_ended()
            return SESSION_ENDED
        ref = self._serve_refs.get(rank)
        try:
            if ref is None or not self.ray.wait([ref], timeout=0, fetch_local=False)[0]:
                return None
            self.ray.get(ref, timeout=0)
        except Exception as exc:  # noqa: BLE001 - the actor died, or its lane could not start
            return self._rank_actors.gone(rank, exc)
        return None

    def _session_ended(self) -> None:
        """Close quietly, asking Ray nothing: its session (and every actor of it) is gone."""
        if not self.closed:
            self.mark_broken(SESSION_ENDED)
            self.shutdown()

    # -- replacing dead ranks ------------------------------------------------------
    def _add_spares(self, count: int) -> None:
        for _ in range(count):
            self._spares.append(self._start_actor({**self._actor_opts[0], "name": next(self._spare_names)}))

    def replace_ranks(self, ranks: Sequence[int]) -> dict[str, str]:
        """Kill ``ranks``' actors (hung ones too), start new ones (spares first), rendezvous on a fresh port.

        A used spare is topped up in the background (docs/replacing-ranks.md).
        """
        if self.closed:
            raise DispatchError(f"ray group {self.spec.name!r} is shut down")
        if self._detached:
            raise DispatchError("ranks of a detached ray group cannot be replaced; create a new group")
        group = self._rank_actors
        deadline = time.monotonic() + self._start_timeout
        for rank in ranks:  # the old actors' ends are not the new ones' to report
            self.lane.retire([rank], f"rank {rank} was replaced")
        self._kill(group.actors[rank] for rank in ranks)
        used_spares = min(len(self._spares), len(ranks))
        fresh = dict(zip(ranks, self._spares[:used_spares], strict=False))  # the first ranks take the spares
        del self._spares[:used_spares]
        for rank in ranks[used_spares:]:
            fresh[rank] = self._start_actor(self._actor_opts[rank], deadline)
        infos = self._wait([info for _, info, _ in fresh.values()], deadline, "start replacement actors")
        for rank, info in zip(fresh, infos, strict=True):
            group.actors[rank], _, group.names[rank] = fresh[rank]
            self._row_addresses.pop(rank, None)
            group.infos[rank] = info
        # A fresh port on rank 0's node: the old world's store may still hold the old one.
        ask = group.actors[0].describe.options(concurrency_group=CONTROL_GROUP).remote(True)
        port = self._wait([ask], deadline, "pick a rendezvous port")[0]["port"]
        group.infos[0] = {**group.infos[0], "port": port}
        env = self._rank_env(group.infos)
        self._open_ranks(ranks, env)
        self._add_spares(used_spares)
        return {key: env[0][key] for key in ("MASTER_ADDR", "MASTER_PORT")}

    # -- growing and shrinking (``_grow``) ----------------------------------------------
    def add_ranks(self, count: int) -> dict[str, str]:
        """New actors placed as the group's (a pooled group's in a new placement group; see ``_grow``)."""
        return _grow.add_ranks(self, count)

    def remove_ranks(self, ranks: Sequence[int]) -> dict[str, str]:
        """The removed ranks' actors are killed; the rest are renumbered (see ``_grow``)."""
        return _grow.remove_ranks(self, ranks)

    def spares_ready(self, timeout: float | None = None) -> int:
        """Wait up to ``timeout`` seconds for the spare actors' processes; how many are up."""
        refs = [info for _, info, _ in self._spares]
        return len(self.ray.wait(refs, num_returns=len(refs), timeout=timeout)[0]) if refs else 0

    def _start_actor(self, options: dict[str, Any], deadline: float = 0.0) -> tuple[Any, Any, str]:
        """A new actor, its ``describe()`` reference and name; retried until ``deadline`` while Ray frees the name."""
        while True:
            try:
                actor = actor_class().options(**options).remote()
            except ValueError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.05)
            else:
                return actor, actor.describe.remote(False), options["name"]

    def _actor_options(self) -> list[dict[str, Any]]:
        opts, pool, names = self.options, self._pool, self._rank_actors.names
        base: dict[str, Any] = {"max_restarts": 0, "max_task_retries": 0, **(opts["ray_actor_options"] or {})}
        if opts["runtime_env"] is not None:
            base["runtime_env"] = opts["runtime_env"]
        if self._namespace is not None:
            base["namespace"] = self._namespace
        if opts["detached"]:
            base["lifetime"] = "detached"
        if pool is None:
            base["num_cpus"], base["num_gpus"] = self._asks()
            return [{**base, "name": name} for name in names]
        if pool.world_size != self.spec.world_size:
            raise DispatchValueError(
                f"world_size={self.spec.world_size} but the resource pool has {pool.world_size} ranks; "
                "use a pool of that size or pool.split([...])"
            )
        if opts["detached"] and not pool.detached:
            raise DispatchValueError("a detached group needs a pool made with RayResourcePool(..., detached=True)")
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        base["num_cpus"], base["num_gpus"] = self._asks()
        pool.acquire()
        self._pool_acquired = True
        strategies = [
            PlacementGroupSchedulingStrategy(
                placement_group=slot.placement_group,
                placement_group_bundle_index=slot.bundle_index,
                placement_group_capture_child_tasks=True,
            )
            for slot in pool.slots(self._start_timeout)
        ]
        return [{**base, "name": name, "scheduling_strategy": s} for name, s in zip(names, strategies, strict=True)]

    def _asks(self) -> tuple[float, float]:
        if self._pool is not None:
            return self._pool.actor_resources(self.options["num_gpus"])
        return float(self.options["cpus_per_worker"] or 0), float(self.options["num_gpus"] or 0)

    def _rank_env(self, infos: list[dict[str, Any]]) -> list[dict[str, str]]:
        """torch.distributed's variables per rank; rank 0's node and port are the rendezvous."""
        n, addr, port = self.spec.world_size, str(infos[0]["ip"]), int(infos[0]["port"])
        if self._collective is None:  # on the driver, so it outlives replaced ranks
            self._use_lane()  # the store listens where the lane does
            host = self.lane.host
            try:
                self._collective = serve_store(host)
            except OSError as exc:
                raise DispatchError(
                    f"ray group {self.spec.name!r}: the driver could not open the store of its ranks' collectives "
                    f"on {host} ({type(exc).__name__}: {exc}), so the group cannot start"
                ) from exc
        envs = []
        for rank, (local, size) in enumerate(local_ranks([info["node_id"] for info in infos])):
            env = rank_environment(
                rank, n, master_addr=addr, master_port=port, local_rank=local, local_world_size=size, extra=self._env
            )
            # verl's Ray workers read these too (its rollout workers size themselves by RAY_LOCAL_WORLD_SIZE).
            env.update(RAY_LOCAL_RANK=str(local), RAY_LOCAL_WORLD_SIZE=str(size))
            env[COLLECTIVE_STORE_ENV] = str(self._collective[1])
            envs.append(env)
        return envs

    def _wait(self, refs: list[Any], deadline: float, what: str) -> list[Any]:
        ray = self.ray
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=max(0.0, deadline - time.monotonic()))
        if len(ready) < len(refs):
            late = [rank for rank, ref in enumerate(refs) if ref not in ready]
            raise PlacementTimeoutError(
                f"ray group {self.spec.name!r}: could not {what} for rank(s) {late} within "
                f"{self._start_timeout:g} s (start_timeout). Each actor asks for {self._resources_text()}; "
                f"the cluster has {ray.available_resources()} available of {ray.cluster_resources()}"
            )
        values = []
        for rank, ref in enumerate(refs):
            try:
                values.append(ray.get(ref))
            except Exception as exc:  # noqa: BLE001 - actor died while starting
                raise WorkerDiedError(
                    rank, f"its Ray actor {self._rank_actors.names[rank]!r} died while starting: {exc}", "__init__"
                ) from exc
        return values

    def _resources_text(self) -> str:
        cpus, gpus = self._asks()
        if self._pool is not None:
            return f"a bundle of {self._pool.bundle()} ({cpus:g} CPU, {gpus:g} GPU of it)"
        extra = self.options["ray_actor_options"] or {}
        return f"{cpus:g} CPU, {gpus:g} GPU" + (f", {extra}" if extra else "")

    def _attach(self, handles: list[Any] | None) -> None:
        """Use running actors: the detached group ``spec.name``'s, or ``handles`` of other groups (never killed)."""
        group, size = self._rank_actors, self.spec.world_size
        if handles is None:
            for rank, name in enumerate(group.names):
                try:
                    group.actors.append(self.ray.get_actor(name, namespace=self._namespace))
                except ValueError as exc:
                    raise DispatchError(
                        f"no detached ray group {self.spec.name!r} with rank {rank} (actor {name!r} in namespace "
                        f"{self._namespace!r}); create it with WorkerGroup(..., backend='ray', detached=True, "
                        f"name={self.spec.name!r})"
                    ) from exc
        elif len(handles) != size:
            raise DispatchValueError(f"actors: {len(handles)} handles for a group of world_size={size}")
        else:
            group.actors.extend(handles)
        refs = [a.identity.options(concurrency_group=CONTROL_GROUP).remote() for a in group.actors]
        what = f"reach the {'detached' if handles is None else 'given'} actors"
        idents = self._wait(refs, time.monotonic() + self._start_timeout, what)
        for rank, ident in enumerate(idents):
            if handles is None and (ident["world_size"] != size or not ident["started"]):
                raise DispatchError(
                    f"detached group {self.spec.name!r} rank {rank} hosts world size {ident['world_size']}, not {size}"
                )
            if handles is not None and not ident["started"]:
                raise DispatchError(f"actors[{rank}] hosts no started worker; pass the actors of a running group")
            if handles is not None:
                group.names[rank] = f"{ident['group']}-rank{ident['rank']}"
        self._attached_ids = [str(i.get("actor_id") or name) for i, name in zip(idents, group.names, strict=True)]
        self._launch_env = None
        self._join_lane(range(size))

    # -- calls -------------------------------------------------------------------
    def submit(self, call: Call) -> LaneCallHandle:
        """The lane's (the core's row reads too: they ride the control link, beside a running call)."""
        handle = super().submit(call)
        if self.poll_interval is not None:
            handle.poll = min(handle.poll, self.poll_interval)
        return handle

    # -- futures forwarded rank to rank -----------------------------------------------
    def describe_results(self, handle: CallHandle) -> list[ResultShape | None] | None:
        """Shapes of a Ray call's results, learnt by one of this group's actors: no rows reach the driver.

        ``None`` (the core resolves on the driver, which reports any error)
        whenever the results are not all in this Ray's object store.
        """
        group = self._rank_actors
        refs = None if group.closed or not group.actors else self._stored_results(handle)
        if refs is None:
            return None
        timeout = self.spec.death_timeout
        ref = group.actors[0].describe_results.options(concurrency_group=CONTROL_GROUP).remote(refs, timeout)
        try:
            return list(self.ray.get(ref, timeout=timeout))
        except Exception:  # noqa: BLE001 - timed out, or a failed producer: the driver path reports it
            return None

    def _stored_results(self, handle: CallHandle) -> list[Any] | None:
        """Each rank's ``take_result`` reference, or ``None`` unless every result was kept in the object store."""
        if not isinstance(handle, LaneCallHandle):
            return None
        try:
            handle.result()
        except DispatchError:
            return None
        refs = []
        for position in range(len(handle.call.ranks)):
            token = handle.bulk_results.get(position)
            if not isinstance(token, KeptResult) or token.ref is None or token.source is None:
                return None
            if token.source.job_id != self.job_id or token.source.closed:
                return None
            refs.append(token.ref)
        return refs

    def forward_chunk(self, handle: CallHandle, plan: ChunkPlan) -> Forwarded:
        """The references ``plan`` reads; the receiving rank joins its rows (``_forward.resolve``)."""
        refs = self._stored_results(handle)
        assert refs is not None  # noqa: S101 - describe_results declined any other
        return Forwarded({p: refs[p] for p in plan.sources}, plan)

    # -- lazy results: rows fetched actor to actor --------------------------------------
    def row_address(self, rank: int) -> RowAddress:
        """Rank ``rank``'s actor, which any Ray group of this driver can fetch kept rows from."""
        if rank not in self._row_addresses:
            group = self._rank_actors
            info = group.infos[rank] if rank < len(group.infos) else {}
            actor_id = self._attached_ids[rank] if self._attached_ids else str(info.get("actor_id", group.names[rank]))
            self._row_addresses[rank] = RowAddress(self._ray_key, actor_id, group.names[rank], group.actors[rank])
        return self._row_addresses[rank]

    def can_fetch_rows(self, address: Any) -> bool:
        """True for the actors of any Ray group of this driver's Ray connection."""
        return isinstance(address, RowAddress) and address.ray == self._ray_key and not self._rank_actors.closed

    def tensor_address(self) -> Any:
        """Weight transfers' buckets are objects in this Ray, which any Ray group of this driver reads."""
        return ("ray", self._ray_key)

    def can_receive_tensors(self, address: Any) -> bool:
        return bool(address == ("ray", self._ray_key)) and not self._rank_actors.closed

    # -- state -------------------------------------------------------------------
    def actor(self, rank: int) -> Any:
        return self._rank_actors.actors[rank]

    def actor_name(self, rank: int) -> str:
        return self._rank_actors.names[rank]

    def node_of(self, rank: int) -> str:
        """``node <ip> (<node id prefix>)`` hosting ``rank``, for error messages."""
        return self._rank_actors.node_of(rank)

    @property
    def session(self) -> str:
        """The Ray session this group lives in (``_runtime.in_session`` tells whether it still runs)."""
        return self._ray_key

    @property
    def actors(self) -> list[Any]:
        """The actor handles, in rank order."""
        return list(self._rank_actors.actors)

    def can_replace_ranks(self) -> bool:
        """Not the ranks of a detached group (another driver may own them)."""
        return super().can_replace_ranks() and not self._detached

    def stop_ranks(self) -> None:
        """Kill the actors (detached groups: only let go of them), then release the pool; Ray's session may be gone."""
        group = self._rank_actors
        group.closed = True
        ranks, group.actors = group.actors, []
        actors = ranks + [actor for actor, _, _ in self._spares]
        self._spares = []
        store, self._collective = self._collective, None
        alive = group.ray is not None and in_session(self.ray, self._ray_key)
        if not self._detached:
            if alive:
                self._kill(actors)
                _grow.release(self)
            self._outlive(ranks, store, alive)
        if self._pool_acquired and self._pool is not None:
            self._pool_acquired = False
            if alive:
                self._pool.release()

    def _outlive(self, ranks: list[Any], store: Any, alive: bool) -> None:
        """The store outlives the killed ranks (spares hold no client): a rank whose store vanished under it prints
        torch's C++ trace.  Ranks on this node are awaited as processes, others as Ray sees them."""
        infos, here = self._rank_actors.infos, self._driver_node
        local = [info["pid"] for info in infos if info and info.get("node_id") == here]
        remote = [a for i, a in enumerate(ranks) if i >= len(infos) or infos[i].get("node_id") != here]
        outlive(self.ray, self._ray_key, remote if alive else [], store, local)

    def _kill(self, actors: Iterable[Any]) -> None:
        for actor in actors:
            with contextlib.suppress(Exception):  # already gone
                self.ray.kill(actor, no_restart=True)


def _spare_count(value: Any, pooled: bool, detached: bool) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise DispatchValueError(f"spare_ranks must be an int >= 0, got {value!r}")
    if value and (pooled or detached):
        raise DispatchValueError(
            "spare_ranks works for groups without a resource_pool and not detached (a pool's bundles are its "
            "ranks'); leave spare_ranks=0 there: replacing a rank then starts a new actor in the dead one's bundle"
        )
    return value


def _user_env(env: Mapping[str, Any] | None) -> dict[str, str]:
    """The user's worker environment, checked now rather than after the actors started."""
    if env is None:
        return {}
    if not isinstance(env, Mapping):
        raise DispatchTypeError(f"env must be a mapping of variable names to values, got {type(env).__name__}")
    rank_environment(0, 1, master_addr=LOOPBACK, master_port=0, extra=env)  # raises on a rank variable
    if ray_local := sorted({"RAY_LOCAL_RANK", "RAY_LOCAL_WORLD_SIZE"} & set(env)):
        raise DispatchValueError(f"worker environment may not set {ray_local}: the executor sets them per rank")
    return {str(k): str(v) for k, v in env.items()}
