"""The Ray actor behind one rank: a :class:`~dispatchcore.WorkerHost` plus plumbing.

The class is plain Python; :func:`actor_class` wraps it with ``ray.remote``
on first use, so importing this module never imports ray.  Worker methods
run in the actor's default concurrency group (one thread, so every call,
``__init__`` included, runs on the same thread: CUDA's current device and
thread-locals stay put).  ``ping`` runs in a separate ``control`` group so
the driver can tell a busy rank from a dead one while a call is running.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from typing import Any

from dispatchcore import RemoteFailure, WorkerHost

from . import _payload
from ._runtime import cuda_device_index, free_port, node_ip

#: What ``RankActor.call`` returns: ``(OK_RAW | OK_PACKED | FAILED, payload)``.
OK_RAW, OK_PACKED, FAILED = 0, 1, 2

CONTROL_GROUP = "control"

#: Layout of a call without arguments (sent as no argument at all).
NO_ARGS: tuple[Any, ...] = ((), {}, ())


class RankActor:
    """One rank of a group, hosted in a Ray actor process."""

    def __init__(self) -> None:
        self._host: WorkerHost | None = None
        self._isolate = True
        self._rank = -1
        self._world_size = 0
        self._group = ""
        self._cls_name = ""

    # -- start-up (driver calls these in order) --------------------------------
    def describe(self, want_port: bool = False) -> dict[str, Any]:
        """Where this actor lives, so the driver can lay out ranks and env."""
        import ray

        ctx = ray.get_runtime_context()
        return {
            "ip": node_ip(),
            "node_id": ctx.get_node_id(),
            "pid": os.getpid(),
            "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
            "port": free_port() if want_port else None,
        }

    def start(
        self,
        packed_spec: Any,
        rank: int,
        world_size: int,
        env: Mapping[str, str],
        isolate: bool,
        group: str,
    ) -> RemoteFailure | None:
        """Set the environment and device, then build the worker (failures returned)."""
        os.environ.update(env)
        self._rank, self._world_size, self._isolate, self._group = rank, world_size, isolate, group
        try:
            worker_cls, init_args, init_kwargs = _payload.unpack(packed_spec, copy=True)
            self._cls_name = worker_cls.__name__
            self._select_device()
        except BaseException as exc:  # noqa: BLE001 - reported to the driver
            return RemoteFailure.capture(rank, "__init__", exc)
        self._host = WorkerHost(worker_cls, rank, world_size, tuple(init_args), dict(init_kwargs))
        return self._host.start()

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
    def call(self, method: str, layout: tuple[Any, ...] = NO_ARGS, *values: Any) -> tuple[int, Any]:
        """Run ``method``; ``layout`` says how ``values`` map onto its arguments."""
        host = self._host
        if host is None:
            failure = RemoteFailure(self._rank, method, "RuntimeError", "worker was not started", "")
            return FAILED, failure
        arg_slots, kwarg_slots, kinds = layout
        try:
            resolved = [_resolve(kind, value, self._isolate) for kind, value in zip(kinds, values, strict=True)]
            args = tuple(resolved[i] for i in arg_slots)
            kwargs = {k: resolved[i] for k, i in kwarg_slots.items()}
        except BaseException as exc:  # noqa: BLE001 - reported to the driver
            return FAILED, RemoteFailure.capture(host.rank, method, exc)
        ok, value = host.run(method, args, kwargs)
        if not ok:
            return FAILED, value
        try:
            kind, payload = _payload.encode_result(value)
        except BaseException as exc:  # noqa: BLE001
            failure = RemoteFailure.capture(host.rank, method, exc)
            failure.message = f"its result cannot be pickled ({exc}); return picklable values"
            return FAILED, failure
        return (OK_RAW if kind == _payload.RAW else OK_PACKED), payload

    def call_plain(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """verl's ``execute_*_async``: the value itself in the object store, errors raised."""
        if self._host is None:
            raise RuntimeError("worker was not started")
        ok, value = self._host.run(method, args, kwargs)
        if not ok:
            raise value.to_error()
        return value

    # -- control group (runs beside a busy call) --------------------------------
    def ping(self) -> int:
        """Liveness probe; answers even while a worker method is running."""
        return threading.get_ident()

    def identity(self) -> dict[str, Any]:
        """Rank, world size and class of the hosted worker (for attaching by name)."""
        return {
            "rank": self._rank,
            "world_size": self._world_size,
            "group": self._group,
            "worker_cls": self._cls_name,
            "started": self._host is not None,
        }

    def describe_results(self, refs: list[Any], timeout: float) -> list[Any]:
        """Row counts and meta of another call's results (for forwarding futures)."""
        from ._forward import describe_results

        return describe_results(refs, timeout)

    def close(self) -> None:
        if self._host is not None:
            self._host.close()


def _resolve(kind: int, value: Any, isolate: bool) -> Any:
    if kind == _payload.FORWARD:
        from ._forward import resolve_forwarded

        return resolve_forwarded(value, isolate)
    return _payload.decode(kind, value, copy=isolate)


_ACTOR_CLASS: Any = None


def actor_class() -> Any:
    """``ray.remote(RankActor)`` with a one-thread ``control`` concurrency group."""
    global _ACTOR_CLASS
    if _ACTOR_CLASS is None:
        import ray

        _ACTOR_CLASS = ray.remote(concurrency_groups={CONTROL_GROUP: 1})(RankActor)
    return _ACTOR_CLASS
