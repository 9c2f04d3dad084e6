"""``TorchrunExecutor``: ranks as torch.distributed processes.

Everything generic comes from the public contract
(:mod:`dispatchcore.executor`, :mod:`dispatchcore.wire`); this package holds
only what is specific to torchrun: how ranks start (``_worlds``, ``_spawn``),
how messages and bytes move (``_protocol``, ``_control``, ``_wire``,
``_transport``, ``_rows``, ``_row_plane``) and how death is seen (``_hub``).

Rank 0 (the driver) is the hub: each call's per-rank arguments are pickled
once per distinct object (``Call.unique_values``), their tensors posted as
gloo sends straight from the caller's memory (small ones ride inside the
command), and a command sent on each rank's control link.  The hub's reader threads deliver each rank's answer to
the call's :class:`~dispatchcore.executor.RankCallHandle` as it comes: into
the handle's :class:`~dispatchcore.wire.RowBuffers` when the collect step
concatenates, else into fresh buffers.  Under torchrun, worker 0 lives in
the driver on a :class:`~dispatchcore.executor.RankThread` and gets what a
pickle round trip would give it (:func:`~dispatchcore.executor.run_isolated`);
self-started worlds (no torchrun) put every worker in a child process.

Lazy results: a consuming rank fetches its rows straight from the processes
keeping them (``_row_plane``): over the world's transport when both groups
live in one world (the launch, or one self-started group with its colocated
roles), over bridges when they are two self-started worlds
(``_bridge_rows``); the driver reads the rows and sends them on only for a
world that is gone or another backend's (``can_fetch_rows`` says which).
"""

from __future__ import annotations

import threading
import time
import uuid
import weakref
from collections.abc import Sequence
from typing import Any

from dispatchcore import DispatchError, DispatchTypeError, DispatchValueError, WorkerDiedError
from dispatchcore.executor import (
    LOOPBACK,
    Call,
    Executor,
    GroupSpec,
    RankCallHandle,
    RankThread,
    RemoteFailure,
    WorkerHost,
    cancel_in_process,
    check_copyable,
    check_options,
    free_port,
    rank_environment,
    run_isolated,
    thread_stacks,
    unpicklable_error,
    unpicklable_spec_error,
)
from dispatchcore.wire import RowBuffers

from . import _env
from ._bridge import BridgeLink
from ._bridge_rows import WorldStore, reachable, world_started, world_stopped
from ._collective import collective_link
from ._hub import Hub
from ._row_plane import RowPlane
from ._rows import RowPlan
from ._wire import Packed, pack
from ._worlds import SpawnedWorld, torchrun_bridge, torchrun_hub, torchrun_identity

#: The tensor address of every torchrun group: a source's store is reachable from every destination's process.
BRIDGE_ADDRESS = ("torchrun", "bridge")
_DEFAULTS: dict[str, Any] = {"ranks": None, "start_timeout": 120.0, "transport_timeout": 1800.0, "spare_ranks": 0}


class _Handle(RankCallHandle):
    """One call: the hub's readers and worker 0's thread deliver; the base owns every bound."""

    def __init__(self, executor: TorchrunExecutor, call: Call) -> None:
        super().__init__(call, death_timeout=executor.spec.death_timeout, on_broken=executor.mark_broken)
        self._gone = executor.gone_reason
        self._rows: RowPlan | None = None
        if call.results_are_copied:
            self.row_buffers = RowBuffers()
            self._rows = RowPlan(len(call.ranks), self.row_buffers)

    def targets(self, position: int, layout: Any) -> tuple[dict[int, Any], dict[str, Any]] | None:
        """Where the hub receives a DataProto result's rows (see ``_rows``); ``None``: fresh memory."""
        return None if self._rows is None else self._rows.targets(position, layout)

    def check_alive(self, waiting: list[int]) -> None:
        for position in waiting:
            detail = self._gone(self.call.ranks[position])
            if detail is not None:
                self.rank_died(position, detail)


class TorchrunExecutor(Executor):
    """Backend ``"torchrun"``: ``torchrun --nproc-per-node=N driver.py``, or self-started ranks.

    Options: ``ranks`` (world ranks hosting this group, under torchrun;
    default ``0..world_size-1``), ``start_timeout`` (seconds for the ranks to
    come up and build their workers, default 120), ``transport_timeout``
    (bound on one tensor transfer, default 1800).  Under torchrun the launch's
    transport is built by the first group, with its timeouts.
    """

    name = "torchrun"
    # torch.distributed comes with torch and cloudpickle with the core: a plain install runs it.

    @classmethod
    def launch_world_size(cls) -> int | None:
        return _env.torchrun_world_size()

    def __init__(self, spec: GroupSpec) -> None:
        super().__init__(spec)
        options = check_options(self.name, spec.options, _DEFAULTS)
        start_timeout = self._start_timeout = float(options["start_timeout"])
        transport_timeout = float(options["transport_timeout"])
        spares = options["spare_ranks"]
        if isinstance(spares, bool) or not isinstance(spares, int) or spares < 0:
            raise DispatchValueError(f"spare_ranks must be an int >= 0, got {spares!r}")
        self._closed = False
        self._gid = f"{spec.name}#{uuid.uuid4().hex[:8]}"
        self._local: RankThread | None = None
        self._world: SpawnedWorld | None = None
        self._submit_lock = threading.Lock()
        #: Calls not known to be finished: one abandoned by Ctrl-C keeps its ranks busy, so shutdown will not wait.
        self._calls: weakref.WeakSet[RankCallHandle] = weakref.WeakSet()
        ranks = _check_ranks(options["ranks"], spec.world_size)
        if _env.under_torchrun():
            if spares:
                raise DispatchValueError(
                    "spare_ranks needs self-started ranks: under the torchrun launcher its agent owns every "
                    "process; run the driver without torchrun to have spares"
                )
            size = int(_env.torchrun_world_size() or 0)
            self._hub: Hub = torchrun_hub(start_timeout=start_timeout, transport_timeout=transport_timeout)
            self._packed_spec = _pack_spec(spec)  # here: the launch's other ranks serve from the line above
            if max(ranks) >= size:
                raise DispatchValueError(f"ranks {ranks} do not fit this torchrun launch of {size} processes")
            #: The world rank (data rank) hosting each group rank; 0 is this process.
            self._data_ranks = list(ranks)
            self._world_identity = torchrun_identity()
            #: Where this world's store is, for consumers in other self-started worlds (``_bridge_rows``);
            #: ``None``: the launch is the only world, nothing to bridge to.
            self._world_store: WorldStore | None = None
        else:
            #: The worker class and init arguments as every rank gets them, pickled before any process
            #: starts: one that cannot be pickled is refused with nothing started or sent.
            self._packed_spec = _pack_spec(spec)
            self._world = SpawnedWorld(
                spec.world_size,
                start_timeout=start_timeout,
                transport_timeout=transport_timeout,
                spares=spares,
                group=spec.name,
            )
            self._hub = self._world.hub
            self._data_ranks = [self._world.data_rank(g) for g in range(spec.world_size)]
            self._world_identity = self._world.identity
            self._world_store = WorldStore.of(self._hub.store, self._world.prefix)
        try:
            self._start(start_timeout)
        except BaseException:
            self.shutdown()
            raise
        if self._world is not None:
            world_started(self._world_identity)

    # -- replacing dead ranks -------------------------------------------------------
    def replace_ranks(self, ranks: Sequence[int]) -> dict[str, str]:
        """Hand ``ranks`` to spare processes (self-started worlds with ``spare_ranks``).

        The spares already belong to the executor's transport, so nothing
        else changes; the old processes are killed first (a hung rank too).
        """
        if self._closed:
            raise DispatchError("this torchrun group is shut down")
        if self._world is None:
            raise DispatchError(
                "ranks started by the torchrun launcher cannot be replaced: its agent owns every process (its "
                "--max-restarts restarts the whole launch). The driver exits naming the dead rank; for in-place "
                "replacement run the driver without torchrun (self-started ranks) with spare_ranks=k"
            )
        if len(self._world.spares) < len(ranks):
            raise DispatchError(
                f"no spare process left to replace rank(s) {list(ranks)}: self-started torchrun ranks are "
                "replaced from spares; create the group with spare_ranks=k"
            )
        spec = self.spec
        port = free_port(LOOPBACK)
        taken: dict[int, int] = {}
        for g in ranks:
            self._world.kill(self._data_ranks[g])
            d = self._world.take_spare()
            if d is None:
                raise DispatchError(f"every spare process is gone; cannot replace rank {g}")
            taken[g] = d
        for g, d in taken.items():
            self._data_ranks[g] = d
            self._world.assign(d, g)
        positions = tuple(taken)
        handle = _Handle(self, Call("__init__", positions, [()] * len(positions), [{}] * len(positions)))
        packed = self._packed_spec
        with self._submit_lock:
            for p, (g, d) in enumerate(taken.items()):
                env = rank_environment(g, spec.world_size, master_addr=LOOPBACK, master_port=port)
                self._send_start(packed, g, d, env, (handle, p))
        handle.result(self._start_timeout)
        return {"MASTER_ADDR": LOOPBACK, "MASTER_PORT": str(port)}

    # -- start ----------------------------------------------------------------------
    def _start(self, timeout: float) -> None:
        spec = self.spec
        ranks = tuple(range(spec.world_size))
        handle = _Handle(self, Call("__init__", ranks, [()] * len(ranks), [{}] * len(ranks)))
        if 0 in self._data_ranks:
            rank = self._data_ranks.index(0)
            host = WorkerHost(spec.worker_cls, rank, spec.world_size, spec.init_args, dict(spec.init_kwargs))
            RowPlane.equip(host, self._hub.rows, death_timeout=spec.death_timeout, isolate=spec.isolate)
            bridge = torchrun_bridge()
            if bridge is not None:
                host.tensor_link = BridgeLink(bridge, spec.death_timeout)
            host.collective = collective_link(self._hub.store, self._gid)
            self._local = RankThread(host, f"dispatchcore-{spec.name}-rank{rank}")
            self._local.put(lambda: _start_local(handle, rank, host))
        remote = [g for g, d in enumerate(self._data_ranks) if d != 0]
        if remote:
            with self._submit_lock:
                for g in remote:
                    self._send_start(self._packed_spec, g, self._data_ranks[g], None, (handle, g))
        handle.result(timeout)

    def _send_start(self, packed: Any, g: int, d: int, env: dict[str, str] | None, slot: Any) -> None:
        """Ask process ``d`` to build group rank ``g``'s worker (``env``: a spare's new rank variables)."""
        spec = self.spec
        sends: list[Any] = []
        first = self._hub.send_value(packed, d, sends)
        cid = self._hub.next_cid()
        message = (
            "start", cid, self._gid, g, spec.world_size, packed.header, first, env, spec.death_timeout, spec.isolate
        )  # fmt: skip
        self._hub.command(d, message, slot, cid, (sends, packed))

    # -- calls ------------------------------------------------------------------------
    def submit(self, call: Call) -> RankCallHandle:
        if self._closed:
            raise DispatchError("this torchrun group is shut down")
        if call.beside:
            return self._read_rows(self._hub.row_plane(), call)  # beside any running call, never behind it
        handle = _Handle(self, call)
        self._calls.add(handle)
        unique = call.unique_values()
        remote = [(p, self._data_ranks[g]) for p, g in enumerate(call.ranks) if self._data_ranks[g] != 0]
        needed = {p: sorted({*unique.arg_slots[p], *unique.kwarg_slots[p].values()}) for p, _ in remote}
        packed: dict[int, Packed] = {}
        for slots in needed.values():
            for slot in slots:
                if slot not in packed:
                    packed[slot] = _pack_or_explain(unique.values[slot], call.method)
        local = [p for p, g in enumerate(call.ranks) if self._data_ranks[g] == 0]
        if local and self.spec.isolate:  # worker 0's copy is made on its thread: refuse what it would fail on
            _check_copyable(call, local[0])
        with self._submit_lock:
            for p, d in remote:
                works: list[Any] = []
                values = [
                    (slot, packed[slot].header, self._hub.send_value(packed[slot], d, works)) for slot in needed[p]
                ]
                cid = self._hub.next_cid()
                message = (
                    "call",
                    cid,
                    self._gid,
                    call.method,
                    values,
                    unique.arg_slots[p],
                    unique.kwarg_slots[p],
                    call.instructions,
                )
                self._hub.command(d, message, (handle, p), cid, (works, packed))
        for p in local:
            self._run_local(call, handle, p)
        return handle

    def _read_rows(self, rows: RowPlane, call: Call) -> RankCallHandle:
        """A driver visit to kept rows (a ``RowAccess``: frees, then reads), by this process's row plane."""
        handle = _Handle(self, call)
        self._calls.add(handle)
        rank, access = call.ranks[0], call.args[0][0]
        if access.free:
            self._hub_free(rows, self._data_ranks[rank], list(access.free))

        def fetch() -> None:
            try:
                parts = rows.fetch(list(access.requests), death_timeout=self.spec.death_timeout)
            except WorkerDiedError as exc:
                handle.rank_died(0, exc.detail)
            except BaseException as exc:  # noqa: BLE001 - reported to the reading caller
                handle.deliver(0, False, RemoteFailure.capture(rank, call.method, exc))
            else:
                handle.deliver(0, True, parts)

        threading.Thread(target=fetch, name=f"dispatchcore-{self.spec.name}-read-rows", daemon=True).start()
        return handle

    def _hub_free(self, rows: RowPlane, data_rank: int, keys: list[str]) -> None:
        if data_rank != 0 and self._hub.dead_reason(data_rank) is None:
            try:
                rows.free(data_rank, keys)
            except Exception:  # noqa: BLE001, S110 - the store is gone: so are the rows
                pass

    def _run_local(self, call: Call, handle: RankCallHandle, position: int) -> None:
        """Queue worker 0's part on its thread, isolated as a remote rank would be."""
        assert self._local is not None
        host = self._local.host
        isolate = self.spec.isolate
        args, kwargs = call.args[position], call.kwargs[position]

        def task() -> None:
            outcome = run_isolated(
                host,
                call.method,
                args,
                kwargs,
                isolate_inputs=isolate,
                isolate_result=isolate and not call.results_are_copied,
                instructions=call.instructions,
            )
            handle.deliver(position, *outcome)

        self._local.put(task)

    # -- lazy results: rows fetched process to process ----------------------------------
    def row_address(self, rank: int) -> Any:
        """``(world, data rank, world store)``: the process keeping rank ``rank``'s rows, and how to reach it.

        The data rank is 0 for worker 0 under torchrun (the driver); the world
        store is ``None`` under the launcher (one world), else the self-started
        world's :class:`~._bridge_rows.WorldStore`.
        """
        return (self._world_identity, self._data_ranks[rank], self._world_store)

    def can_fetch_rows(self, address: Any) -> bool:
        """Rows of this world move over its transport; another running self-started world's, over bridges."""
        if not (isinstance(address, tuple) and len(address) == 3):
            return False
        if address[0] == self._world_identity:
            return True
        return self._world is not None and not self._closed and reachable(address)

    # -- weight transfers: bridges between the ranks involved (``_bridge``) ----------------
    def tensor_address(self) -> Any:
        """Every torchrun group's ranks can bridge to every other's: the launch's, or self-started on this machine."""
        return BRIDGE_ADDRESS

    def can_receive_tensors(self, address: Any) -> bool:
        return bool(address == BRIDGE_ADDRESS)

    def gone_reason(self, group_rank: int) -> str | None:
        """Why the rank hosting ``group_rank`` is known to be gone, or ``None``."""
        d = self._data_ranks[group_rank]
        if d != 0:
            return self._hub.dead_reason(d)
        if self._local is not None and not self._local.is_alive():
            return "worker 0's thread is no longer running"
        return None

    # -- stopping a call -------------------------------------------------------------------
    def cancel_call(self, call: Call, ranks: Sequence[int]) -> bool:
        """Worker 0's call stopped here; each other process's data thread told to stop it there."""
        if self._closed:
            return False
        call_id = call.instructions.call_id
        for d in sorted({self._data_ranks[g] for g in ranks}):
            if d == 0:
                cancel_in_process(call_id)
            elif self._hub.dead_reason(d) is None:
                RowPlane.send_cancel(self._hub.store, d, call_id)
        return True

    def can_replace_ranks(self) -> bool:
        """Self-started worlds with a spare left (the launcher's agent owns its processes)."""
        return not self._closed and self._world is not None and bool(self._world.spares)

    # -- where each rank is ----------------------------------------------------------------
    def rank_stacks(self, ranks: Sequence[int], all_threads: bool, timeout: float) -> dict[int, str]:
        """Worker 0 read off its thread here; the others asked of each process's data thread, beside any call."""
        if self._closed:
            return {}
        deadline = time.monotonic() + timeout
        out: dict[int, str] = {}
        for g in ranks:
            d = self._data_ranks[g]
            if d == 0:
                if self._local is not None:
                    out[g] = thread_stacks(self._local.thread.ident, all_threads)
                continue
            if self._hub.dead_reason(d) is not None:
                continue
            text = self._hub.row_plane().stacks(d, all_threads, max(0.0, deadline - time.monotonic()))
            if text is not None:
                out[g] = text
        return out

    # -- shutdown ----------------------------------------------------------------------
    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._world is not None:
            world_stopped(self._world_identity)  # its rows can no longer be fetched over bridges
        stuck = self.broken is not None or any(not call.settled() for call in list(self._calls))
        if self._world is not None:
            self._world.stop(wait=0.5 if stuck else 10.0)
        elif not self._hub.closed:
            for d in set(self._data_ranks) - {0}:
                self._hub.command(d, ("close", self._gid))
        if self._local is not None:
            self._local.request_stop()
            self._local.join(0.0 if stuck else 2.0)


def _start_local(handle: RankCallHandle, position: int, host: WorkerHost) -> None:
    """Build worker 0 on its own thread, with the rank's GPU current there."""
    _env.set_local_device()
    failure = host.start()
    handle.deliver(position, failure is None, failure)


def _check_ranks(ranks: Any, world_size: int) -> list[int]:
    if ranks is None:
        return list(range(world_size))
    if isinstance(ranks, (str, bytes)) or not hasattr(ranks, "__iter__"):
        raise DispatchTypeError(f"ranks must be a list of ints, got {ranks!r}")
    out = list(ranks)
    if any(isinstance(r, bool) or not isinstance(r, int) or r < 0 for r in out) or len(set(out)) != len(out):
        raise DispatchValueError(f"ranks must be distinct ints >= 0, got {ranks!r}")
    if len(out) != world_size:
        raise DispatchValueError(
            f"ranks {out} name {len(out)} processes but world_size is {world_size}; pass world_size=len(ranks)"
        )
    return out


def _pack_or_explain(value: Any, method: str) -> Packed:
    """``pack(value)``, or the one error for an argument that cannot be pickled (the core names the argument)."""
    try:
        return pack(value)
    except Exception as exc:
        raise unpicklable_error(method, value, exc) from exc


def _pack_spec(spec: GroupSpec) -> Packed:
    """The worker class and init arguments packed for the ranks, or the one error naming what cannot be pickled."""
    try:
        return pack((spec.worker_cls, tuple(spec.init_args), dict(spec.init_kwargs)))
    except Exception as exc:
        raise unpicklable_spec_error(spec, exc) from exc


def _check_copyable(call: Call, position: int) -> None:
    """Refuse worker 0's arguments (copied on its thread, in this process) if their copy would fail."""
    for value in (*call.args[position], *call.kwargs[position].values()):
        try:
            check_copyable(value)
        except Exception as exc:
            raise unpicklable_error(call.method, value, exc, in_process=True) from exc
