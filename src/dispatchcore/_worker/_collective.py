"""Collectives between the ranks of one group: the rank side of :mod:`dispatchcore.collective`.

Where the ranks live decides how they reduce, and only the executor knows
it, so each executor hands every rank's :class:`~dispatchcore.executor.WorkerHost`
a :class:`CollectiveLink` (``host.collective``):

* :class:`ThreadCollective`: ranks that are threads of one process (one
  object shared by the group's ranks); they meet in memory and reduce in rank
  order, so every rank gets the same bits;
* :class:`StoreCollective`: ranks in processes of their own, with a
  ``torch.distributed`` store every rank reaches; its communicators are
  built on a ``PrefixStore`` of it on first use (never ``new_group``), one
  per replacement generation and abort epoch;
* the plain :class:`CollectiveLink`: no store to offer; only the user's own
  default group can be used, and the error says so.

The user's default group, when one is initialized over exactly this group's
ranks, always wins on process backends: collectives then interleave in the
order the user expects with the user's own.  The one
``collective.init_process_group`` made does not: it forwards to the same
link (``docs/process-groups.md``).
"""

from __future__ import annotations

import contextlib
import pickle
import threading
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any, ClassVar

from .._base import DispatchError, DispatchTimeoutError
from ._rank_context import call_cancelled, current_call

#: The reductions every path supports.
REDUCE_OPS = ("sum", "avg", "product", "min", "max")
#: How long a rank waits for the others in one collective (seconds) unless told otherwise.
DEFAULT_TIMEOUT_S = 300.0
#: The default process group ``collective.init_process_group`` made in this process: (link, torch's group).
LIBRARY_DEFAULT: list[tuple[CollectiveLink, Any]] = []
#: Environment variable through which a process executor tells its ranks where its collective store is.
STORE_ENV = "DISPATCHCORE_COLLECTIVE_STORE"


class CollectiveLink:
    """How one rank's group runs collectives; the base offers no group of its own.

    ``backend`` is the executor's name (what :func:`dispatchcore.collective.rank_info`
    reports); ``shares_process`` is the executor's :attr:`~dispatchcore.executor.Executor.ranks_share_process`.
    """

    shares_process: ClassVar[bool] = False

    def __init__(self, backend: str, why_none: str = "") -> None:
        self.backend = backend
        self.generation = 0
        self._why_none = why_none

    def own_group(self, rank: int, world_size: int, timeout: float) -> Any | None:
        """A process group over the group's ranks built on the executor's store, or ``None`` (no store)."""
        return None

    def store(self, timeout: float) -> Any | None:
        """A store every rank of the group reaches, or ``None``."""
        return None

    def rebuild(self, generation: int) -> None:
        """After a replacement: later collectives use a fresh group (every rank agrees on ``generation``)."""
        self.generation = generation

    def abort(self, group: Any = None) -> None:
        """The call ended early: free ranks waiting in a collective (from any thread)."""

    def missing_group_error(self) -> DispatchError:
        """What to do when there is neither a default group nor a store."""
        why = self._why_none or f"the {self.backend!r} backend gives its ranks no store to build a group on"
        return DispatchError(
            f"dispatchcore.collective found no process group: {why}; call "
            "torch.distributed.init_process_group('gloo') in the worker (its environment has RANK, "
            "WORLD_SIZE, MASTER_ADDR and MASTER_PORT) and dispatchcore.collective uses that default group"
        )


class ThreadCollective(CollectiveLink):
    """Ranks that are threads of one process: one object per group, shared by all its ranks."""

    shares_process: ClassVar[bool] = True

    def __init__(self, backend: str, world_size: int) -> None:
        super().__init__(backend)
        self.world_size = world_size
        self._cond = threading.Condition()
        self._arrived = 0
        self._round = 0
        self._slots: list[Any] = [None] * world_size

    def meet(self, timeout: float) -> None:
        """Wait until every rank of the group has arrived (a barrier that a cancel or a timeout leaves cleanly).

        Waits in short slices so a cancelled call (``Worker.cancelled``) and
        the interrupt that follows it land here instead of blocking in C.
        """
        deadline = time.monotonic() + timeout
        with self._cond:
            this_round = self._round
            self._arrived += 1
            if self._arrived == self.world_size:
                self._arrived, self._round = 0, self._round + 1
                self._cond.notify_all()
                return
            try:
                while self._round == this_round:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise DispatchTimeoutError(
                            f"a collective waited {timeout:.0f}s for the other ranks of its group"
                        )
                    if call_cancelled():
                        raise DispatchError("the call was cancelled while its rank waited in a collective")
                    self._cond.wait(min(left, 0.1))
            except BaseException:
                if self._round == this_round:
                    self._arrived -= 1
                raise

    def abort(self, group: Any = None) -> None:
        with self._cond:
            self._cond.notify_all()  # the cancelled waiters raise at once instead of at their next slice

    def exchange(self, rank: int, value: Any, timeout: float) -> list[Any]:
        """Every rank's ``value``, in rank order.

        The values are the ranks' own objects: read them, then :meth:`meet`
        again before writing to your own, so nobody reads a value changed under it.
        """
        self._slots[rank] = value
        self.meet(timeout)
        return list(self._slots)


class StoreCollective(CollectiveLink):
    """Ranks in processes of their own, reaching one store (given, or at ``address`` and connected on first use).

    Its gloo group is abortable (see ``docs/process-groups.md``): this link
    holds the only reference, so dropping it closes the group's connections
    and a peer blocked in a collective on it raises at once.  An abort sets
    ``<generation>.<epoch>/aborted`` in the store; every rank's watcher thread
    then drops its group too (idle ranks included), and the next collective
    builds one on the first epoch not aborted, which every rank agrees on.
    """

    def __init__(self, backend: str, store: Any = None, address: tuple[str, int] | None = None) -> None:
        super().__init__(backend)
        self._store = store
        self._address = address
        #: This epoch's communicators, by kind (see :meth:`communicator`); this link holds the only references.
        self._built: dict[str, Any] = {}
        self.epoch = 0
        #: Store clients of their own: the abort signal (from a cancel's thread) and the watcher's blocking wait.
        self._signal: Any = None
        #: The client communicators are built on: a build a cancel left behind blocks in the store until its
        #: timeout, so after a failed build the next gets a new client, and the rank's own is never held up.
        self._builder: Any = None
        self._building = False
        #: The call whose first collective checked that the group was not aborted meanwhile.
        self._checked: Any = None
        self._lock = threading.Lock()

    @staticmethod
    def serve(host: str) -> tuple[Any, str]:
        """Driver side: a store for a group's ranks, on a free port of ``host``; (store, value for :data:`STORE_ENV`).

        Keep the store for the group's life and drop it at shutdown.  Its port
        is its own, never the ``MASTER_PORT`` the user's ``init_process_group``
        will take.
        """
        store = listening_store(host)
        return store, f"{host}:{store.port}"

    @classmethod
    def from_environment(cls, backend: str, environ: dict[str, str] | Any) -> CollectiveLink:
        """The link a process executor announced in :data:`STORE_ENV` (``host:port``), else a plain one."""
        value = environ.get(STORE_ENV)
        if not value:
            return CollectiveLink(backend)
        host, _, port = value.rpartition(":")
        return cls(backend, address=(host, int(port)))

    def store(self, timeout: float) -> Any | None:
        """The executor's store (connected on first use), or ``None``."""
        if self._store is None and self._address is not None:
            import torch.distributed as dist

            host, port = self._address
            self._store = dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=timeout))
        return self._store

    def own_group(self, rank: int, world_size: int, timeout: float) -> Any | None:
        return self.communicator("group", rank, world_size, timeout)

    def communicator(self, kind: str, rank: int, world_size: int, timeout: float) -> Any | None:
        """This epoch's communicator of ``kind`` (built on first use), or ``None`` without a store.

        ``"group"``: a gloo backend for :mod:`dispatchcore.collective`;
        ``"default"``: a ``ProcessGroup`` (gloo, and NCCL for CUDA where there
        is a GPU) that torch's default group made by ``init_process_group`` forwards to.
        """
        with self._lock:
            store = self.store(timeout)
            if store is None:
                return None
            if self._signal is None:
                self._signal, self._builder = store.clone(), store.clone()
                threading.Thread(target=self._watch, args=(store.clone(),), daemon=True).start()
            flag = current_call()
            dropped: dict[str, Any] = {}
            if self._built and flag is not self._checked:
                self._checked = flag  # once per call: an abort this rank's watcher has not seen yet
                if store.check([self._key("aborted")]):
                    dropped = self._drop()
            if kind in self._built:
                return self._built[kind]
            while store.check([self._key("aborted")]):
                self.epoch += 1
            epoch, prefix = self.epoch, self._key(kind)
            self._building = True
        _release(dropped)
        builder = self._builder
        try:
            built = _build_interruptibly(kind, builder, prefix, rank, world_size, timeout)
        except BaseException:
            with self._lock:  # its build may still block in the store (until its timeout): never build on it again
                if self._builder is builder:
                    self._builder = store.clone()
            self.abort()  # other ranks may have joined this epoch's build: nobody reuses it
            raise
        with self._lock:
            self._building = False
            if self.epoch != epoch:
                raise DispatchError("the group's collectives were aborted while it was being built")
            self._built[kind], self._checked = built, flag
            return built

    def abort(self, group: Any = None) -> None:
        """Drop this rank's communicators and tell every rank to drop theirs (``group``: only if still current).

        Safe from any thread: a rank blocked in a collective on them is freed
        by its peers' closing.
        """
        with self._lock:
            if group is not None and group not in self._built.values():
                return
            if not self._built and not self._building:
                return
            key = self._key("aborted")
            dropped = self._drop()
            signal = self._signal
        signal.set(key, b"1")  # first: a group with work in flight closes only once its peers closed theirs
        _release(dropped)

    def rebuild(self, generation: int) -> None:
        with self._lock:
            key = self._key("aborted")
            super().rebuild(generation)
            dropped = self._drop()
            self.epoch = 0
            signal = self._signal
        if signal is not None:
            signal.set(key, b"1")  # wakes the watcher, which waits on the old generation's key
        _release(dropped)

    def _key(self, name: str) -> str:
        return f"dispatchcore-collective/{self.generation}.{self.epoch}/{name}"

    def _drop(self) -> dict[str, Any]:
        """Move to the next epoch (under the lock); the communicators to release once it is let go."""
        dropped, self._built, self._building = self._built, {}, False
        self.epoch += 1
        return dropped

    def _watch(self, store: Any) -> None:
        """Drop this rank's communicators when another rank aborts them (a thread: the rank may be idle)."""
        while True:
            with self._lock:
                key = self._key("aborted")
            try:
                store.wait([key], timedelta(days=1))
            except Exception:  # noqa: BLE001 - the store is gone: the group is shutting down
                return
            with self._lock:
                dropped = self._drop() if self._key("aborted") == key else {}
            _release(dropped)


def _build(kind: str, store: Any, prefix: str, rank: int, world_size: int, timeout: float) -> Any:
    import torch
    import torch.distributed as dist

    store, span = dist.PrefixStore(prefix, store), timedelta(seconds=timeout)
    if kind == "group":
        return dist.ProcessGroupGloo(store, rank, world_size, span)
    group = dist.ProcessGroup(store, rank, world_size)
    group._register_backend(
        torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO, dist.ProcessGroupGloo(store, rank, world_size, span)
    )
    group._set_default_backend(dist.ProcessGroup.BackendType.GLOO)
    if torch.cuda.is_available():
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = span
        nccl = dist.ProcessGroupNCCL(dist.PrefixStore("nccl/", store), rank, world_size, options)
        group._register_backend(torch.device("cuda"), dist.ProcessGroup.BackendType.NCCL, nccl)
    return group


def _release(dropped: dict[str, Any]) -> None:
    """Let an epoch's communicators go, outside the link's lock: gloo's destructor (which holds the GIL) waits
    for work in flight; NCCL communicators have a real abort (ops in flight on the GPU end)."""
    import torch

    default = dropped.get("default")
    if default is not None and torch.cuda.is_available():
        try:
            default._get_backend(torch.device("cuda")).abort()
        except Exception:  # noqa: BLE001 - dropping it is all that is left
            pass
    dropped.clear()


def _build_interruptibly(kind: str, store: Any, prefix: str, rank: int, world_size: int, timeout: float) -> Any:
    """A communicator of ``kind`` on ``prefix`` of ``store``.

    Building waits for every rank, so it runs on a thread of its own while
    this one waits in Python, where a cancel (or its interrupt) ends the wait.
    """
    built: list[Any] = []

    def build() -> None:
        try:
            built.append(_build(kind, store, prefix, rank, world_size, timeout))
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
            built.append(exc)

    thread = threading.Thread(target=build, daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while thread.is_alive():
        if call_cancelled():
            raise DispatchError("the call was cancelled while its rank built the group's collectives")
        if time.monotonic() > deadline:
            raise DispatchTimeoutError(f"building a collective group waited {timeout:.0f}s for the other ranks")
        thread.join(0.05)
    if isinstance(built[0], BaseException):
        raise built[0]
    return built[0]


def made_default_group() -> bool:
    """Whether torch's default group in this process is the one ``collective.init_process_group`` made."""
    import torch.distributed as dist

    return bool(LIBRARY_DEFAULT) and LIBRARY_DEFAULT[0][1] is dist.group.WORLD


def reduce_in_order(values: Sequence[Any], op: str) -> Any:
    """``values`` (tensors, rank order) reduced by ``op``; the same bits on every rank that computes it."""
    import torch

    total = values[0].clone()
    for other in values[1:]:
        if op in ("sum", "avg"):
            total += other
        elif op == "product":
            total *= other
        elif op == "min":
            torch.minimum(total, other, out=total)
        else:
            torch.maximum(total, other, out=total)
    if op == "avg":
        total /= len(values)
    return total


def pickled(value: Any) -> bytes:
    """An object as bytes for a broadcast between processes."""
    return pickle.dumps(value, protocol=5)


def listening_store(host: str, timeout_s: float = 60.0) -> Any:
    """A master ``TCPStore`` listening on ``host`` only, on a free port.

    ``TCPStore(host, 0, is_master=True)`` listens on every interface whatever ``host`` says, and a store
    has no authentication: the socket is bound to ``host`` first and handed over (the store owns it then).
    """
    import socket

    import torch.distributed as dist

    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind((host, 0))
        sock.listen(socket.SOMAXCONN)
        port = int(sock.getsockname()[1])
        store = dist.TCPStore(
            host, port, None, True, timedelta(seconds=timeout_s), wait_for_workers=False, master_listen_fd=sock.fileno()
        )
    except BaseException:
        with contextlib.suppress(OSError):  # a store that failed may have closed it already
            sock.close()
        raise
    sock.detach()
    return store
