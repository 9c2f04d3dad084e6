"""The opt-in hot path: a group's calls served by one Ray Compiled Graph.

``WorkerGroup(..., backend="ray", compiled=True)``.  A fixed loop calls the
same methods on the same ranks every step; a compiled graph replaces each
call's Ray tasks with shared-memory channels that every actor polls.

One graph per group, over all its ranks: each actor's node is
``RankActor.compiled_call``, which takes ``(method, layout, values)`` (or
``None`` for a rank the call leaves out), so one graph serves every method
and every argument structure of the group.  (Ray allows one live graph per
actor; a graph per method would tear down and recompile at each switch.)

Life cycle: compiled at the first eligible call (that call pays the compile,
seconds), served by one daemon thread that executes calls in order and reads
each result as it lands, torn down when no call came for ``compiled_idle_s``
seconds, on a graph error (a dead actor closes the channels), before a call
the graph cannot carry (object references or forwarded futures in its
arguments: it then runs as a plain call), and at shutdown.  The next eligible
call compiles again.

Results are the plain path's: a raising worker gives the same
:class:`~dispatchcore.WorkerError`; inputs and results are always copied out
of the channel buffers (``isolate=False`` changes nothing here), because the
next step overwrites them.  Costs: each actor spins a core while the graph
lives; worker methods run on Ray's ``_ray_system`` thread instead of the
actor's default thread; the first call waits for the compile.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from dispatchcore.executor import Call, CallHandle, RankCallHandle, RemoteFailure

from . import _payload
from ._rank_actors import RankActors
from ._tags import FORWARD, bare_layout
from ._task_layout import rank_task

#: Tells the serving thread to tear the graph down and stop.
_STOP = object()


class CompiledCallHandle(RankCallHandle):
    """A call served by the graph; the serving thread delivers its results (or its plain fallback's)."""

    def __init__(self, rank_actors: RankActors, call: Call) -> None:
        super().__init__(call, death_timeout=rank_actors.death_timeout, on_broken=rank_actors.mark_broken)
        self.error: BaseException | None = None

    def fail(self, error: BaseException) -> None:
        """End the call with ``error`` (what its plain fallback raised)."""
        self.error = error
        for position in self.waiting_positions():
            self.deliver(position, True, None)

    def outcome(self) -> list[Any]:
        if self.error is not None:
            raise self.error
        return super().outcome()


class CompiledGraph:
    """One group's compiled graph and the daemon thread that serves it.

    It sees the group through ``rank_actors`` and runs a call the graph can no
    longer serve through ``submit_plain`` (the executor's plain path).
    """

    def __init__(self, rank_actors: RankActors, idle_s: float, submit_plain: Callable[[Call], CallHandle]) -> None:
        self.rank_actors = rank_actors
        self.submit_plain = submit_plain
        self.idle_s = idle_s
        self._lock = threading.Lock()
        self._queue: queue.Queue[Any] = queue.Queue()
        self._thread: threading.Thread | None = None
        #: The serving thread is tearing the graph down: new calls wait for it, then compile anew.
        self._stopping = False
        self._inflight = 0
        self._idle = threading.Condition(self._lock)
        #: Figures for benchmarks and tests: compiles so far, the last compile's seconds, teardowns and why.
        self.compiles = 0
        self.compile_s: float | None = None
        self.teardowns: list[str] = []

    @property
    def live(self) -> bool:
        """Whether a graph is compiled and being served now."""
        return self._thread is not None and not self._stopping

    # -- the driver's side -------------------------------------------------------
    def try_submit(self, call: Call) -> CompiledCallHandle | None:
        """Send ``call`` through the graph (compiling it if needed), or ``None`` if it cannot carry it."""
        tasks = self._tasks(call)
        if tasks is None:
            self.close("a call the graph cannot carry (object references or forwarded futures)")
            return None
        handle = CompiledCallHandle(self.rank_actors, call)
        while True:
            with self._lock:
                thread = self._thread
                if thread is None:
                    self._start()
                    thread = None
                if not self._stopping:
                    self._inflight += 1
                    self._queue.put((handle, tasks))
                    return handle
            if thread is not None:
                thread.join()

    def _tasks(self, call: Call) -> list[Any] | None:
        """Each rank's graph input (``None``: not in the call); ``None`` if a value must go as a plain task."""
        inputs: list[Any] = [None] * self.rank_actors.world_size
        if not any(call.args) and not any(call.kwargs):
            for rank in call.ranks:
                inputs[rank] = (call.method, bare_layout(call.instructions), ())
            return inputs
        unique = call.unique_values()
        for value in unique.values:
            if type(value).__name__ == "ObjectRef":
                return None
        encoded = _payload.encode_all(unique.values, _as_is, bundle=False)
        if any(kind == FORWARD for kind, _, _ in encoded):
            return None

        for position, rank in enumerate(call.ranks):
            layout, tops = rank_task(call, unique, encoded, position)
            inputs[rank] = (call.method, layout, tuple(tops))
        return inputs

    def drain(self) -> None:
        """Wait until the graph has served every call sent to it (before a plain call, so none overlap)."""
        with self._idle:
            while self._inflight and self._thread is not None:
                self._idle.wait(0.5)

    def close(self, reason: str, wait: float | None = None) -> bool:
        """Tear the graph down once it has served what it was sent; whether it is gone within ``wait`` s."""
        with self._lock:
            thread = self._thread
            if thread is None:
                return True
            if not self._stopping:
                self._queue.put((_STOP, reason))
        thread.join(wait)
        return not thread.is_alive()

    # -- the serving thread --------------------------------------------------------
    def _start(self) -> None:
        ray = self.rank_actors.ray
        from ray.dag import InputNode, MultiOutputNode

        actors = list(self.rank_actors.actors)
        started = time.monotonic()
        with InputNode() as inp:
            dag = MultiOutputNode([actor.compiled_call.bind(inp[rank]) for rank, actor in enumerate(actors)])
        graph = dag.experimental_compile(_submit_timeout=-1)
        try:
            # The first execution builds the channels' readers on every actor (seconds): pay it now.
            for ref in graph.execute(*[None] * len(actors)):
                ray.get(ref, timeout=-1)
        except BaseException:
            graph.teardown()
            raise
        self.compile_s = time.monotonic() - started
        self.compiles += 1
        self._thread = threading.Thread(
            target=self._serve, args=(graph,), name="dispatchcore-ray-compiled", daemon=True
        )
        self._thread.start()

    def _serve(self, graph: Any) -> None:
        reason = "idle"
        try:
            while True:
                try:
                    handle, tasks = self._queue.get(timeout=self.idle_s)
                except queue.Empty:
                    with self._lock:
                        if self._queue.empty():
                            reason = f"idle for {self.idle_s:g} s"
                            self._stopping = True  # a new call waits for this teardown, then compiles anew
                            break
                    continue
                if handle is _STOP:
                    reason = tasks
                    with self._lock:
                        self._stopping = True
                    break
                try:
                    self._execute(graph, handle, tasks)
                except Exception as exc:  # noqa: BLE001 - a graph error: this call is reported, the rest go plain
                    reason = f"graph error: {type(exc).__name__}: {exc}"
                    with self._lock:
                        self._stopping = True
                    self._report_graph_error(handle, exc)
                    self._done()
                    break
                self._done()
        finally:
            self._teardown(graph, reason)

    def _execute(self, graph: Any, handle: CompiledCallHandle, tasks: list[Any]) -> None:
        ray = self.rank_actors.ray
        refs = graph.execute(*tasks)
        for position, rank in enumerate(handle.call.ranks):
            self._accept(handle, position, ray.get(refs[rank], timeout=-1))
        # Ranks left out answered ``None``: read them too, so their buffers are freed in order.
        for rank, ref in enumerate(refs):
            if tasks[rank] is None:
                ray.get(ref, timeout=-1)

    @staticmethod
    def _accept(handle: CompiledCallHandle, position: int, value: Any) -> None:
        # Channel buffers are reused by the next step: always a private copy.
        rank, method = handle.call.ranks[position], handle.call.method
        handle.deliver(position, *_payload.decode_result(value, copy=True, rank=rank, method=method))

    def _report_graph_error(self, handle: CompiledCallHandle, exc: BaseException) -> None:
        """A dead rank gives ``WorkerDiedError`` (as on the plain path); else the graph's error, per rank."""
        group, ray = self.rank_actors, self.rank_actors.ray
        waiting = handle.waiting_positions()
        pings = [group.actor(handle.call.ranks[p]).ping.options(concurrency_group="control").remote() for p in waiting]
        ready, _ = ray.wait(pings, num_returns=len(pings), timeout=min(5.0, group.death_timeout))
        dead = False
        for position, ping in zip(waiting, pings, strict=True):
            rank = handle.call.ranks[position]
            try:
                alive = ping in ready and ray.get(ping) is not None
            except Exception:  # noqa: BLE001 - the actor is gone
                alive = False
            if not alive:
                dead = True
                handle.rank_died(
                    position,
                    f"its Ray actor {group.actor_name(rank)!r} on {group.node_of(rank)} is gone "
                    f"(compiled graph: {type(exc).__name__})",
                )
        if not dead:
            for position in waiting:
                failure = RemoteFailure.capture(handle.call.ranks[position], handle.call.method, exc)
                failure.message = f"the compiled graph failed ({type(exc).__name__}: {exc}); later calls run plain"
                handle.deliver(position, False, failure)

    def _done(self) -> None:
        with self._idle:
            self._inflight -= 1
            self._idle.notify_all()

    def _teardown(self, graph: Any, reason: str) -> None:
        try:
            graph.teardown()
        except Exception:  # noqa: BLE001, S110 - actors already gone
            pass
        self.teardowns.append(reason)
        # Calls queued behind the graph's end run as plain calls, with the same results.
        while True:
            try:
                handle, _ = self._queue.get_nowait()
            except queue.Empty:
                break
            if handle is not _STOP:
                self._run_plain(handle)
                self._done()
        with self._idle:
            self._thread = None
            self._stopping = False
            self._idle.notify_all()

    def _run_plain(self, handle: CompiledCallHandle) -> None:
        try:
            values = self.submit_plain(handle.call).result()
        except Exception as exc:  # noqa: BLE001 - delivered to the caller as the plain call raised it
            handle.fail(exc)
            return
        for position, value in enumerate(values):
            handle.deliver(position, True, value)


def _as_is(value: Any) -> Any:
    """``put`` of ``_payload.encode_all`` for the graph: values travel in the channel, not the object store."""
    return value
