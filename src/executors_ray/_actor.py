"""The Ray actor behind one rank: a :class:`~dispatchcore.WorkerHost` plus plumbing.

The class is plain Python; :func:`actor_class` wraps it with ``ray.remote``
on first use, so importing this module never imports ray.  Calls come by the
control lane (``_lane_rank``) and run on the rank's method thread, where the
worker's ``__init__`` ran too (CUDA's current device and thread-locals stay
put).  Ray actor methods are left for start-up and joining the lane (a
one-thread ``control`` concurrency group, answering beside a running call),
for what only Ray can hand over (values holding object references, large
results) and lazy results' rows (``take_rows``, the core's row reads and
frees) in a ``rows`` group of their own, so a rank keeps serving the rows it
holds while it runs a long call (``_rows``), and for verl's plain calls
(:meth:`RankActor.call_plain`), whose references verl's own code reads.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from typing import Any

from dispatchcore.executor import (
    ATOMS,
    RemoteFailure,
    ResultShape,
    StoreCollective,
    WorkerHost,
    free_port,
    keep_freed_memory,
    thread_stacks,
)

from . import _forward, _payload
from ._lane_rank import RankLane
from ._method_thread import MethodThread
from ._rows import RowFetcher, serve_rows
from ._runtime import cuda_device_index, node_ip
from ._tags import CONTROL_GROUP, FAILED, FORWARD, OK_PACKED, RAW, ROWS_GROUP, ROWS_THREADS, Layout
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
        #: The one thread every worker method runs on, ``__init__`` included, whichever way the call came.
        self._methods = MethodThread()
        self._lane = RankLane(self._run, self._methods)

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
    ) -> RemoteFailure | None:
        """Set the environment and device, then build the worker (failures returned).

        ``death_timeout`` bounds this rank's wait on other actors for the rows it fetches.
        The worker is built on the method thread that runs every call; the
        driver then joins the lane.
        """
        os.environ.update(env)
        self._rank, self._world_size, self._isolate, self._group = rank, world_size, isolate, group
        return self._methods.run(self._build, packed_spec, rank, world_size, isolate, death_timeout)  # type: ignore[no-any-return]

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
        self._lane.isolate = self._isolate
        try:
            self._lane.join(address, rank, timeout, inline_max)
        except OSError as exc:
            return f"{type(exc).__name__}: {exc}"
        return None

    def take_result(self, key: Any) -> Any:
        """A lane call's result that is an object reference (``rows`` group)."""
        return self._lane.take_result(key)

    def stash(self, key: Any, *values: Any) -> None:
        """A lane call's values that hold object references, resolved by Ray (``rows`` group)."""
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
    def call_beside(self, method: str, layout: Layout, *values: Any) -> Any:
        """The core's row reads and frees, run in the ``rows`` group itself: never behind a running call."""
        return self._run(method, layout, values, self._isolate)

    def _run(self, method: str, layout: Layout, values: tuple[Any, ...], isolate: bool) -> Any:
        """Run ``method``; ``layout`` says how ``values`` map onto its arguments.

        Returns an atom result as it is, anything else as ``(OK_PACKED,
        payload)`` and a failure as ``(FAILED, RemoteFailure)``: the driver
        tells them apart by ``type(result) is tuple``.
        """
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
        ok, value = self._methods.run(self._host.run, method, args, kwargs)
        if not ok:
            raise value.to_error()
        return value

    # -- control group (runs beside a busy call) --------------------------------
    def stacks(self, all_threads: bool) -> str:
        """Where this rank is: the stack of the thread running its methods (or every thread)."""
        return thread_stacks(self._methods.ident, all_threads)

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
            self._methods.run(self._host.close)


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


@functools.cache
def actor_class() -> Any:
    """``ray.remote`` of ``RankActor`` (made once): a one-thread ``control`` concurrency
    group for start-up and joining the lane, and a ``rows`` group serving kept rows."""
    import ray

    remote: Any = ray.remote  # its overloads do not list concurrency_groups
    return remote(concurrency_groups={CONTROL_GROUP: 1, ROWS_GROUP: ROWS_THREADS})(RankActor)
