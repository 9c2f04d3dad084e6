"""The worker base class: rank and world size right from the first line of ``__init__``.

``self.rank`` and ``self.world_size`` must be right from the first line of a
subclass's ``__init__`` (verl sets them only after).  Executors build workers
through :class:`dispatchcore.WorkerHost`, which publishes the rank in a
thread-local context that :meth:`Worker.__new__` reads; a worker built any
other way falls back to the ``RANK`` / ``WORLD_SIZE`` environment.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from .._base import DispatchTypeError
from ._handover import StateHandover
from ._mesh import DispatchCollectInfo
from ._rank_context import call_cancelled, current_rank_context

if TYPE_CHECKING:
    from ._rejoin import MembershipChange


class Worker(DispatchCollectInfo, StateHandover):
    """Base class of every worker; subclass it and decorate methods with ``@register``.

    Mesh declarations for nd dispatch (``_register_dispatch_collect_info``,
    ``get_dispatch_collect`` / ``set_dispatch_collect``) come from
    :class:`~dispatchcore._worker._mesh.DispatchCollectInfo`; the state a
    replaced rank takes from a live replica (``replica_state`` /
    ``load_replica_state``, ``replicas``) from
    :class:`~dispatchcore._worker._handover.StateHandover`.
    """

    #: Attribute names of this worker's FSDP2 modules: after a failed call the library checks them on every
    #: rank before the next call (``docs/process-groups.md``).
    sharded_modules: ClassVar[tuple[str, ...]] = ()
    #: Attribute names of the optimizers over them: each must hold the modules' current parameters.
    sharded_optimizers: ClassVar[tuple[str, ...]] = ()

    _rank: int
    _world_size: int
    _dispatch_collect_info: dict[str, tuple[int, bool]]

    def __new__(cls, *args: Any, **kwargs: Any) -> Worker:
        self = super().__new__(cls)
        self._rank, self._world_size = current_rank_context()
        self._dispatch_collect_info = {}
        return self

    def __init__(self, cuda_visible_devices: str | None = None) -> None:
        """Takes verl's one argument, so ``super().__init__(cuda_visible_devices)`` ports unchanged.

        The executor has already made the rank's device current before
        ``__init__`` runs, so the value changes nothing: ``None`` (the default,
        and what verl passes for most workers) is ignored, and a string such as
        ``"0,1"`` is kept as ``self._cuda_visible_devices`` (verl's name) for
        code that reads it, never written into ``os.environ`` (ranks of the
        ``local`` backend share one process, and CUDA reads the variable only
        once, at start-up).
        """
        if cuda_visible_devices is not None and not isinstance(cuda_visible_devices, str):
            raise DispatchTypeError(
                f"Worker.__init__(cuda_visible_devices=...) takes None or a string like '0,1' (verl's form), "
                f"got {type(cuda_visible_devices).__name__} {cuda_visible_devices!r}"
            )
        if cuda_visible_devices is not None:
            self._cuda_visible_devices = cuda_visible_devices
        super().__init__()

    @property
    def rank(self) -> int:
        """This worker's rank in its group (0 .. world_size-1)."""
        return self._rank

    @property
    def world_size(self) -> int:
        """Number of ranks in this worker's group."""
        return self._world_size

    def cancelled(self) -> bool:
        """Whether the call running now was cancelled: check it in a long loop and return early.

        The driver's ``future.cancel()`` (or a stream left early, or a timeout
        with ``on_timeout="cancel"``) sets it on every rank of the call, before
        it interrupts the method with :class:`~dispatchcore.CallInterrupted`;
        a method that checks it can stop at a point of its choosing.
        """
        return call_cancelled()

    def on_membership_change(self, change: MembershipChange) -> None:
        """Runs on every rank after ranks were replaced (``WorkerGroup.replace_rank``).

        Override it to rebuild what spans ranks: tear down and re-create a
        ``torch.distributed`` world (``os.environ`` already holds the new
        ``MASTER_ADDR``/``MASTER_PORT``).  A worker defining
        :meth:`replica_state` has the new ranks' state handed over from a live
        replica after this hook; one without can copy it here from
        ``change.source_rank`` or reload a checkpoint (``change.reset`` names
        the ranks left with setup's state).  On a new rank it runs after the
        setup calls were replayed.  The default does nothing.
        """

    def recover_sharded_state(self) -> None:
        """Runs on every rank when the sharded-state check fails after a failed call, and on a replacement.

        Override it in a worker that declares ``sharded_modules``: rebuild
        each module, ``fully_shard`` it and its optimizer, then load the last
        checkpoint (or an in-memory copy you kept).  The check runs again
        after it; the next call runs only if every rank is then fit.  On a
        replacement it runs after ``on_membership_change``, on survivors and
        new ranks alike, so every rank issues the same collectives.  Without
        an override a failed check refuses the next call, naming this hook.
        """

    @property
    def fused_worker_dict(self) -> dict[str, Any]:
        """The role objects of the fused worker hosting this one, by role (verl's name; ``{}`` if none)."""
        fused: dict[str, Any] = self.__dict__.setdefault("_dispatchcore_fused", {})
        return fused

    @fused_worker_dict.setter
    def fused_worker_dict(self, roles: dict[str, Any]) -> None:
        self.__dict__["_dispatchcore_fused"] = roles

    def get_fused_worker_by_name(self, worker_name: str) -> Any:
        """The role object ``worker_name`` of the fused worker hosting this one, or ``None`` (verl's name)."""
        return self.fused_worker_dict.get(worker_name)
