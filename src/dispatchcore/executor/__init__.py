"""The executor contract: everything a backend plugin needs, and nothing private.

For executor authors.  The built-in executors (``local``, ``ray``,
``torchrun``) import only this module, :mod:`dispatchcore.wire` and other
public ``dispatchcore`` names; a third-party executor can do what they do.

What the core does and what you do
----------------------------------
The core owns dispatch, collect, padding, futures and binding: by the time
your executor sees a call, it is a :class:`Call` (a method name, the ranks to
run it on, per-rank arguments, a time bound).  You own how ranks start, how
bytes move and how death is seen.  Subclass :class:`Executor`, set ``name``:

* ``__init__(spec)``: start ``spec.world_size`` ranks hosting
  ``spec.worker_cls``.  On each rank build a :class:`WorkerHost`
  (``host.start()`` runs the worker's ``__init__`` with ``rank`` and
  ``world_size`` set; it returns a :class:`RemoteFailure` instead of raising).
  Read your options with :func:`check_options`; give process ranks
  :func:`rank_environment`.  Refuse a bad option value with
  :class:`~dispatchcore.DispatchValueError` / :class:`~dispatchcore.DispatchTypeError`
  (also ``ValueError`` / ``TypeError``), as every built-in backend does.
* ``submit(call)``: send the call to its ranks at once and return a
  :class:`RankCallHandle` (subclass it or use it as is).  On the rank, run
  ``host.run(call.method, args, kwargs, call.instructions)`` and send back
  ``(ok, value)``; deliver it with :meth:`RankCallHandle.deliver`.
  ``call.instructions`` (:class:`Instructions`: time the call, keep the
  rows...) is the core's; forward it whole, never read it.  If a
  rank is seen dead, call :meth:`RankCallHandle.rank_died`.
* ``shutdown()``: release everything; idempotent; prompt.

:class:`RankCallHandle` owns every time bound, so a backend never writes a
wait loop: the call's timeout (→ :class:`~dispatchcore.DispatchTimeoutError`,
group marked broken), liveness checks every :func:`liveness_poll` seconds
(override :meth:`RankCallHandle.check_alive`; → :class:`~dispatchcore.WorkerDiedError`
as soon as a death is seen), and the lowest-rank failure
(→ :class:`~dispatchcore.WorkerError`, others noted).  Pull-based
transports override :meth:`RankCallHandle.wait_for_progress`.

Isolation (``docs/design.md``, "Invariants"): what a worker receives must equal a pickle round trip
of what was sent.  Across processes :func:`dispatchcore.wire.loads` does it;
in this process use :func:`run_isolated` on a :class:`RankThread`.
``call.results_are_copied`` says the collect step copies results anyway.
A value that cannot be pickled is reported in one wording everywhere, naming
the path to the object at fault, before anything is sent: at start-up
:func:`unpicklable_spec_error` where your pickling of the worker class and
init arguments fails (or :func:`check_spec_picklable` if you pickle nothing
but isolate); in ``submit`` :func:`unpicklable_error` where an argument's
pickling fails (the core rewords it with the argument's name; an in-process
rank checks its arguments first with :func:`check_copyable`); on a rank
:meth:`RemoteFailure.unpicklable` for a result.  Pickle every argument
before the first send, so that a refused call sent nothing.

Optional hooks, with defaults that decline:

* rows moved rank to rank: :meth:`Executor.describe_results` and
  :meth:`Executor.forward_chunk` (the core plans the row ranges with
  :func:`plan_forward`; a rank builds its chunk with :func:`assemble_chunk`);
* lazy results' rows fetched rank to rank: :meth:`Executor.row_address`,
  :meth:`Executor.can_fetch_rows` and ``WorkerHost.fetch_rows`` (a producing
  rank answers a :class:`RowRequest` with :func:`take_kept_rows`); without
  them lazy results still work, with consumers' rows sent by the driver;
* where each rank is: :meth:`Executor.rank_stacks` (build each rank's text
  with :func:`thread_stacks` where the rank lives, answering beside a busy
  call); the core adds the stacks to timeouts and ``WorkerGroup.rank_stacks``;
* stopping a running call: :meth:`Executor.cancel_call` (on the same path,
  run :func:`cancel_in_process` with ``call.instructions.call_id`` in the
  rank's process, without waiting), and :meth:`Executor.can_replace_ranks`
  so the core knows whether it may restart ranks stuck in C code;
* weight transfers (``WeightSync``) rank to rank: :meth:`Executor.tensor_address`,
  :meth:`Executor.can_receive_tensors` and a :class:`TensorLink` as
  ``host.tensor_link`` on each rank; without them the tensors go through
  the driver;
* collectives in worker code (:mod:`dispatchcore.collective`): declare
  :attr:`Executor.ranks_share_process` and set ``host.collective`` on each
  rank before ``host.start()``: one :class:`ThreadCollective` shared by ranks
  that are threads of one process, or a :class:`StoreCollective` per rank on
  a ``torch.distributed`` store every rank reaches (given, or announced to the
  rank processes as ``host:port`` in :data:`COLLECTIVE_STORE_ENV` and read with
  :meth:`StoreCollective.from_environment`); never the user's
  ``MASTER_ADDR``/``MASTER_PORT``.  The plain :class:`CollectiveLink` (the
  default) leaves only the user's own default group;
* :meth:`Executor.launch_world_size` (world size implied by the launcher).

Registering: a module with a :data:`dispatchcore.hookimpl` of
``dispatchcore_register_executors(register)`` calling ``register(MyExecutor)``,
listed under the ``dispatchcore`` entry-point group of your package.  Check
it with :class:`dispatchcore.testing.ExecutorConformance`.  In one process
(a notebook, a benchmark) :func:`register_executor` registers a class
directly.
"""

from __future__ import annotations

from .._base import check_options
from .._lane import (
    BulkPath,
    HandedOver,
    LaneAddress,
    LaneCallHandle,
    LaneDirectory,
    LaneDoor,
    LaneDriver,
    LaneExecutor,
    LaneLink,
    LaneRank,
    address_toward,
    connect_lane,
    frame_object,
    open_lane,
    unframe_object,
)
from .._rows import (
    FREE_ROWS_METHOD,
    TAKE_ROWS_METHOD,
    HeldRows,
    RowRequest,
    free_kept_rows,
    holds_kept_rows,
    kept_results,
    take_kept_rows,
)
from .._runtime import (
    ATOMS,
    RankCallHandle,
    RankThread,
    RemoteFailure,
    WorkerHost,
    cancel_in_process,
    check_copyable,
    check_spec_picklable,
    first_failure,
    isolated_copy,
    liveness_poll,
    run_isolated,
    thread_stacks,
    timeout_error,
    unpicklable_error,
    unpicklable_spec_error,
)
from .._spi import (
    LOOPBACK,
    PLAIN,
    RANK_ENV_KEYS,
    Call,
    CallHandle,
    ChunkPlan,
    Executor,
    ForwardPlan,
    GroupSpec,
    Instructions,
    ResultShape,
    RowPiece,
    UniqueValues,
    assemble_chunk,
    cpu_thread_environment,
    free_port,
    local_ranks,
    plan_forward,
    rank_environment,
    register_executor,
    remaining,
)
from .._trace import TimedResult
from .._transfer import TRANSFER_METHOD, TensorLink, TensorSourceLost, TensorSpec, TransferPlan, plan_transfer, run_step
from .._wire import keep_freed_memory
from .._worker import STORE_ENV as COLLECTIVE_STORE_ENV
from .._worker import CollectiveLink, StoreCollective, ThreadCollective, method_names

__all__ = [
    "ATOMS",
    "COLLECTIVE_STORE_ENV",
    "FREE_ROWS_METHOD",
    "LOOPBACK",
    "PLAIN",
    "RANK_ENV_KEYS",
    "TAKE_ROWS_METHOD",
    "TRANSFER_METHOD",
    "BulkPath",
    "Call",
    "CallHandle",
    "ChunkPlan",
    "CollectiveLink",
    "Executor",
    "ForwardPlan",
    "GroupSpec",
    "HandedOver",
    "HeldRows",
    "Instructions",
    "LaneAddress",
    "LaneCallHandle",
    "LaneDirectory",
    "LaneDoor",
    "LaneDriver",
    "LaneExecutor",
    "LaneLink",
    "LaneRank",
    "RankCallHandle",
    "RankThread",
    "RemoteFailure",
    "ResultShape",
    "RowPiece",
    "RowRequest",
    "StoreCollective",
    "TensorLink",
    "TensorSourceLost",
    "TensorSpec",
    "ThreadCollective",
    "TimedResult",
    "TransferPlan",
    "UniqueValues",
    "WorkerHost",
    "address_toward",
    "assemble_chunk",
    "cancel_in_process",
    "check_copyable",
    "check_options",
    "check_spec_picklable",
    "connect_lane",
    "cpu_thread_environment",
    "first_failure",
    "frame_object",
    "free_kept_rows",
    "free_port",
    "holds_kept_rows",
    "isolated_copy",
    "keep_freed_memory",
    "kept_results",
    "liveness_poll",
    "local_ranks",
    "method_names",
    "open_lane",
    "plan_forward",
    "plan_transfer",
    "rank_environment",
    "register_executor",
    "remaining",
    "run_isolated",
    "run_step",
    "take_kept_rows",
    "thread_stacks",
    "timeout_error",
    "unframe_object",
    "unpicklable_error",
    "unpicklable_spec_error",
]
