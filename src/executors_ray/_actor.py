"""The Ray actor behind one rank: a :class:`~dispatchcore.WorkerHost` plus plumbing.

The class is plain Python; :func:`actor_class` wraps it with ``ray.remote``
on first use, so importing this module never imports ray.  Worker methods
run in the actor's default concurrency group (one thread, so every call,
``__init__`` included, runs on the same thread: CUDA's current device and
thread-locals stay put).  ``ping`` runs in a separate ``control`` group so
the driver can tell a busy rank from a dead one while a call is running, and
lazy results' rows are served (``take_rows``, the core's row reads and
frees) in a ``rows`` group of their own, so a rank keeps serving the rows it
holds while it runs a long call (``_rows``).

Every method a call may name (``GroupSpec.methods``) also gets an actor
method of its own (``w_<name>``, see :func:`actor_class`): each task
argument costs Ray ~0.1 ms to serialize and resolve, so a call without
arguments sends none at all (not even the method name), and one with
arguments sends a single layout (``_tags.Layout``) plus the object
references Ray has to resolve.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Mapping
from typing import Any

from dispatchcore.executor import (
    ATOMS,
    RemoteFailure,
    ResultShape,
    StoreCollective,
    WorkerHost,
    cancel_in_process,
    free_port,
    keep_freed_memory,
    thread_stacks,
)

from . import _forward, _payload
from ._lane_rank import RankLane
from ._method_thread import MethodThread
from ._rows import RowFetcher, serve_rows
from ._runtime import cuda_device_index, node_ip
from ._tags import (
    CONTROL_GROUP,
    DEDICATED_PREFIX,
    FAILED,
    FORWARD,
    NO_ARGS,
    OK_PACKED,
    RAW,
    ROWS_GROUP,
    ROWS_THREADS,
    Layout,
)
from ._transfer import RayTensorLink


class RankActor:
    """One rank of a group, hosted in a Ray actor process."""

    def __init__(self) -> None:
        self._host: WorkerHost | None = None
        self._isolate = True
        self._rank = -1
        self._world_size = 0
        self._group = ""
        self._cls_name = ""
        #: The thread worker methods run on (the actor's default group), for :meth:`stacks`.
        self._method_thread: int | None = None
        #: With the control lane: the one thread every worker method runs on, whichever way it came.
        self._methods: MethodThread | None = None
        self._lane: RankLane | None = None

    # -- start-up (driver calls these in order) --------------------------------
    def describe(self, want_port: bool = False) -> dict[str, Any]:
        """Where this actor lives, so the driver can lay out ranks and env."""
        import ray

        ctx = ray.get_runtime_context()
        return {
            "ip": node_ip(),
            "node_id": ctx.get_node_id(),
            "pid": os.getpid(),
            "actor_id": ctx.get_actor_id(),
            "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
            "port": free_port("") if want_port else None,  # reachable from other nodes
        }

    def start(
        self,
        packed_spec: Any,
        rank: int,
        world_size: int,
        env: Mapping[str, str],
        isolate: bool,
        group: str,
        death_timeout: float = 60.0,
        lane: bool = False,
    ) -> RemoteFailure | None:
        """Set the environment and device, then build the worker (failures returned).

        ``death_timeout`` bounds this rank's wait on other actors for the rows it fetches.
        With ``lane`` the worker is built on the method thread that will run
        every call (see ``_method_thread``); the driver then joins the lane.
        """
        os.environ.update(env)
        self._rank, self._world_size, self._isolate, self._group = rank, world_size, isolate, group
        if lane and self._methods is None:
            self._methods = MethodThread()
            self._lane = RankLane(self._run, self._methods)
        if self._methods is not None:
            self._method_thread = self._methods.ident
            return self._methods.run(self._build, packed_spec, rank, world_size, isolate, death_timeout)  # type: ignore[no-any-return]
        return self._build(packed_spec, rank, world_size, isolate, death_timeout)

    def _build(
        self, packed_spec: Any, rank: int, world_size: int, isolate: bool, death_timeout: float
    ) -> RemoteFailure | None:
        try:
            keep_freed_memory()  # this actor's process is the rank's own
            worker_cls, init_args, init_kwargs = _payload.unpack(packed_spec, copy=True)
            self._cls_name = worker_cls.__name__
            self._select_device()
        except BaseException as exc:  # noqa: BLE001 - reported to the driver
            return RemoteFailure.capture(rank, "__init__", exc)
        self._host = WorkerHost(worker_cls, rank, world_size, tuple(init_args), dict(init_kwargs))
        self._host.fetch_rows = RowFetcher(death_timeout)
        self._host.share_kept_rows = not isolate  # isolate=False: rows kept in this actor are read in place
        self._host.tensor_link = RayTensorLink(death_timeout)  # weight transfers through the object store
        self._host.collective = StoreCollective.from_environment("ray", os.environ)  # the driver's store
        return self._host.start()

    # -- the control lane ----------------------------------------------------------
    def join_lane(self, address: str, rank: int, timeout: float, inline_max: int) -> str | None:
        """Connect to the driver's lane (control group); ``None``, or why it could not."""
        if self._lane is None:
            return "this actor was started without the lane"
        self._lane.isolate = self._isolate
        try:
            self._lane.join(address, rank, timeout, inline_max)
        except OSError as exc:
            return f"{type(exc).__name__}: {exc}"
        return None

    def take_result(self, key: Any) -> Any:
        """A lane call's result that is an object reference (``rows`` group)."""
        assert self._lane is not None  # noqa: S101 - only lane groups keep results
        return self._lane.take_result(key)

    def stash(self, key: Any, *values: Any) -> None:
        """A lane call's values that hold object references, resolved by Ray (``rows`` group)."""
        assert self._lane is not None  # noqa: S101 - only lane groups send stashes
        self._lane.stash(key, values)

    @staticmethod
    def _select_device() -> None:
        """Make this rank's GPU current before the worker's ``__init__`` (GPU actors only)."""
        import ray

        index = cuda_device_index(ray.get_gpu_ids(), os.environ.get("CUDA_VISIBLE_DEVICES"))
        if index is None:
            return
        import torch

        if torch.cuda.is_available():
            torch.cuda.set_device(index % max(1, torch.cuda.device_count()))

    # -- calls -------------------------------------------------------------------
    def call(self, method: str, layout: Layout = NO_ARGS, *values: Any) -> Any:
        """Run ``method``; ``layout`` says how ``values`` map onto its arguments.

        Returns an atom result as it is (Ray stores ``None`` and small atoms
        cheapest, ~30 us less per task than a tuple), anything else as
        ``(OK_PACKED, payload)`` and a failure as ``(FAILED, RemoteFailure)``:
        the driver tells them apart by ``type(result) is tuple``.
        """
        if self._methods is not None:
            return self._methods.run(self._run, method, layout, values, self._isolate)
        return self._run(method, layout, values, self._isolate)

    def call_beside(self, method: str, layout: Layout = NO_ARGS, *values: Any) -> Any:
        """The core's row reads and frees, run in the ``rows`` group itself: never behind a running call."""
        return self._run(method, layout, values, self._isolate, beside=True)

    def compiled_call(self, task: Any) -> Any:
        """One rank's step of a compiled graph (``_compiled``): ``task`` is ``(method, layout, values)``,
        or ``None`` when the call leaves this rank out.  Inputs always copied: they are views of the
        graph's channel buffer, which the next step overwrites."""
        if task is None:
            return None
        method, layout, values = task
        if self._methods is not None:
            return self._methods.run(self._run, method, layout, values, True)
        return self._run(method, layout, values, True)

    def _run(self, method: str, layout: Layout, values: tuple[Any, ...], isolate: bool, beside: bool = False) -> Any:
        if not beside:
            self._method_thread = threading.get_ident()  # the Ray default group's thread, or the method thread
        host = self._host
        if host is None:
            failure = RemoteFailure(self._rank, method, "RuntimeError", "worker was not started", "")
            return FAILED, failure
        arg_slots, kwarg_slots, kinds, sources, inline, instructions = layout
        args: tuple[Any, ...] = ()
        kwargs: dict[str, Any] = {}
        if kinds:
            try:
                resolved = [
                    _resolve(kind, _locate(source, value, values), isolate)
                    for kind, source, value in zip(kinds, sources, inline, strict=True)
                ]
                args = tuple(resolved[i] for i in arg_slots)
                kwargs = {k: resolved[i] for k, i in kwarg_slots.items()}
            except BaseException as exc:  # noqa: BLE001 - reported to the driver
                return FAILED, RemoteFailure.capture(host.rank, method, exc)
        ok, value = host.run(method, args, kwargs, instructions)
        if not ok:
            return FAILED, value
        if value is None or type(value) in ATOMS:
            return value
        try:
            kind, payload = _payload.encode_result(value)
        except BaseException as exc:  # noqa: BLE001
            return FAILED, RemoteFailure.unpicklable(host.rank, method, "result", exc, in_process=False, value=value)
        return payload if kind == RAW else (OK_PACKED, payload)

    def call_plain(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """verl's ``execute_*_async``: the value itself in the object store, errors raised."""
        if self._host is None:
            raise RuntimeError("worker was not started")
        if self._methods is not None:
            ok, value = self._methods.run(self._host.run, method, args, kwargs)
        else:
            ok, value = self._host.run(method, args, kwargs)
        if not ok:
            raise value.to_error()
        return value

    # -- control group (runs beside a busy call) --------------------------------
    def ping(self) -> int:
        """Liveness probe; answers even while a worker method is running."""
        return threading.get_ident()

    def cancel(self, call_id: int) -> int:
        """Stop call ``call_id`` if this rank runs it (or skip it when it comes); how many ran it."""
        return cancel_in_process(call_id)

    def stacks(self, all_threads: bool) -> str:
        """Where this rank is: the stack of the thread running its methods (or every thread)."""
        return thread_stacks(self._method_thread, all_threads)

    def identity(self) -> dict[str, Any]:
        """Rank, world size and class of the hosted worker (for attaching by name)."""
        import ray

        return {
            "actor_id": ray.get_runtime_context().get_actor_id(),
            "rank": self._rank,
            "world_size": self._world_size,
            "group": self._group,
            "worker_cls": self._cls_name,
            "started": self._host is not None,
        }

    def describe_results(self, refs: list[Any], timeout: float) -> list[ResultShape | None]:
        """Row counts and ``meta_info`` of another call's results (for forwarding futures)."""
        return _forward.describe(refs, timeout)

    # -- rows group (serves kept rows beside a busy call) -------------------------
    def take_rows(self, requests: list[Any]) -> tuple[int, Any]:
        """Another rank's fetch of rows this process keeps: ``(OK_PACKED, payload)`` or ``(FAILED, message)``."""
        return serve_rows(self._rank, requests)

    def close(self) -> None:
        if self._host is not None:
            if self._methods is not None:
                self._methods.run(self._host.close)
            else:
                self._host.close()


def _locate(source: Any, inline: Any, values: tuple[Any, ...]) -> Any:
    if source == -1:
        return inline
    if type(source) is int:
        return values[source]
    return values[source[0]][source[1]]


def _resolve(kind: int, value: Any, isolate: bool) -> Any:
    if kind == RAW:
        return value
    if kind == FORWARD:
        return _forward.resolve(value)  # a fresh join: private whatever ``isolate`` says
    return _payload.unpack(value, copy=isolate)


_ACTOR_CLASSES: dict[tuple[str, ...], Any] = {}


def _dedicated(method: str) -> Any:
    def run(self: RankActor, layout: Layout = NO_ARGS, *values: Any) -> Any:
        return self.call(method, layout, *values)

    run.__name__ = run.__qualname__ = DEDICATED_PREFIX + method
    return run


def actor_class(methods: tuple[str, ...] = ()) -> Any:
    """``ray.remote`` of ``RankActor`` plus ``w_<name>`` for each of ``methods``.

    One class per set of method names (cached); a one-thread ``control``
    concurrency group for pings and a ``rows`` group serving kept rows.
    """
    key = tuple(sorted(set(methods)))
    cls = _ACTOR_CLASSES.get(key)
    if cls is None:
        import ray

        attrs: dict[str, Any] = {DEDICATED_PREFIX + name: _dedicated(name) for name in key if name.isidentifier()}
        base: type = RankActor
        if attrs:
            # A distinct name per method set: Ray identifies actor classes by module and name.
            digest = hashlib.sha1(",".join(key).encode()).hexdigest()[:10]  # noqa: S324 - a name, not security
            attrs["__module__"] = __name__
            base = type(f"RankActor_{digest}", (RankActor,), attrs)
        remote: Any = ray.remote  # its overloads do not list concurrency_groups
        cls = _ACTOR_CLASSES[key] = remote(concurrency_groups={CONTROL_GROUP: 1, ROWS_GROUP: ROWS_THREADS})(base)
    return cls
