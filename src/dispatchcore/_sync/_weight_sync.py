"""``WeightSync``: named tensors from one group's ranks to another's, planned by the core, moved by the executor.

The driver only plans and orders: it asks the source ranks what they hold
(``layout``) and, beside it, the destination ranks what they want
(``want``; asked again where the shapes differ from the last transfer's),
computes the plan (``_transfer.plan_transfer``), then keeps a window of
buckets in flight: ``pack`` on a source rank, then one ``move`` step on its
destinations that starts receiving it and applies the bucket before it, so
the next bucket moves while the destinations apply the current one.  The
destinations get the new version (``commit``) only once every rank applied
every bucket.  Per transfer: ``4 + 2·B`` calls for ``B`` buckets, each
side's in flight together.  Where both executors share a
:class:`TensorLink` the bytes go rank to rank; otherwise through the
driver (counted by ``driver_traffic()``, and logged once as slow).
``verify`` compares digests computed on the ranks (``_verify``); phase
times and trace slices come from ``_timeline``.
"""

from __future__ import annotations

import concurrent.futures
import contextvars
import itertools
import logging
import os
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from .._base import DispatchAttributeError, DispatchError, DispatchValueError, WorkerError, did_you_mean
from .._trace import count_received_bytes, count_sent_bytes
from .._transfer import DEFAULT_BUCKET_BYTES, Bucket, Held, TensorSpec, TransferPlan, plan_transfer
from .._transfer._errors import BY_NAME
from . import _verify
from ._steps import Side, submit, wait
from ._timeline import Timeline

_log = logging.getLogger("dispatchcore")
_ids = itertools.count(1)

#: No version: before the first transfer, or after one that failed once bytes moved.
_NONE: Any = object()
#: A bucket size no plan reaches: verify digests each region whole, not split by buckets.
_WHOLE = 1 << 62

Rename = Mapping[str, str] | Callable[[str], str | None]
Names = Collection[str] | Callable[[str], bool]
Dtypes = torch.dtype | Mapping[str, torch.dtype]


@dataclass(frozen=True)
class TransferReport:
    """What one transfer did: the version the destinations now read, how the bytes went, how many."""

    version: Any
    transport: str
    tensors: int
    buckets: int
    bytes_moved: int
    #: Bytes of the driver path a backend without a rank-to-rank link takes (Ray's buckets of at most
    #: 1 MiB cross the driver inside the control lane's messages and are not counted: docs/weight-sync.md).
    driver_bytes: int
    seconds: float
    #: Whether the destinations' weights were checked against the sources' (``verify=True``) before the version.
    verified: bool = False
    #: Seconds by phase: on the driver ``plan``, ``buckets`` (first pack to last apply), ``verify``, ``commit``;
    #: on the ranks, summed over ranks and buckets, ``pack``, ``move`` (receiving) and ``apply``.
    phases: dict[str, float] = field(default_factory=dict)


class TransferFuture:
    """A transfer running in the background (``WeightSync.start``); ``get()`` gives its report or raises."""

    def __init__(self, future: concurrent.futures.Future[TransferReport]) -> None:
        self._future = future

    def get(self, timeout: float | None = None) -> TransferReport:
        return self._future.result(timeout)

    result = get

    def done(self) -> bool:
        return self._future.done()


class WeightSync:
    """Moves named tensors from ``source``'s ranks to ``destination``'s (see ``docs/weight-sync.md``).

    Each source rank's ``offer`` method returns ``{name: tensor, DTensor or
    RowShard}`` (a ``state_dict()`` of FSDP2 DTensors as it is);
    each destination rank's ``apply`` method is called once per bucket with
    a list of ``(name, tensor)`` it completed; an optional ``want`` method
    gets ``{name: (shape, dtype)}`` and returns ``{name: Slice}`` for the
    names it wants a slice of (the rest arrive whole); an optional ``lend``
    method gets ``{name: (shape, dtype)}`` of what will arrive and returns
    ``{name: tensor}`` of its own memory for names to land in (then applied
    as that same tensor: no copy between receive and apply); ``want=None`` or
    ``lend=None``: no such method is asked (``apply=None`` is the core's own
    replica hand-over: the tensors wait on the rank for it).  ``rename`` maps a
    source name to a destination name (``None`` drops it), ``dtype`` casts on
    the way (one dtype: floating-point tensors only; a mapping: by destination
    name), ``names`` keeps a subset (source names).  After a complete
    transfer each destination worker's ``weights_version`` is the version.
    :meth:`verify` (after every transfer, before the version, with
    ``verify=True``) compares digests of every region between the sources
    and what each destination's ``read`` method says it holds.
    """

    def __init__(
        self,
        source: Any,
        destination: Any,
        *,
        offer: str = "weights",
        apply: str | None = "load_weights",
        want: str | None = "weight_slices",
        lend: str | None = "weight_buffers",
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        rename: Rename | None = None,
        dtype: Dtypes | None = None,
        names: Names | None = None,
        read: str = "weights",
        verify: bool = False,
    ) -> None:
        if int(bucket_bytes) <= 0:
            raise DispatchValueError(f"bucket_bytes must be positive, not {bucket_bytes}")
        _check_apply(destination, apply)
        self.source, self.destination = source, destination
        self.offer, self.apply, self.want, self.lend, self.read = offer, apply, want, lend, read
        self.verify_each = bool(verify)
        self.bucket_bytes = int(bucket_bytes)
        self.rename, self.dtype, self.names = rename, dtype, names
        self._lock = threading.Lock()
        self._warned = False
        #: The last transfer's ``{name: (shape, dtype)}``: the next asks ``want`` with it beside ``layout``.
        self._shapes: dict[str, tuple[tuple[int, ...], torch.dtype]] | None = None
        #: What the last plan was made of: the same layout, names and wants plan the same again.
        self._planned: tuple[Any, ...] | None = None
        #: The plan of the last transfer (for inspection and tests).
        self.last_plan: TransferPlan | None = None
        #: The version every destination rank holds from the last complete transfer; ``_NONE`` before the
        #: first and once a transfer failed after bytes began to move (its ranks may then disagree).
        self._held: Any = _NONE

    @property
    def last_version(self) -> Any:
        """The version the destination's ranks hold from the last complete transfer (``None`` if none did)."""
        return None if self._held is _NONE else self._held

    def holds(self, version: Any) -> bool:
        """Whether the last transfer, tagged ``version``, completed on every destination rank.

        ``False`` before the first transfer and after one that failed once bytes moved (the ranks may
        then hold different weights): ``grow(sync=...)`` then syncs every rank (``docs/elastic-groups.md``).
        """
        return self._held is not _NONE and bool(self._held == version)

    def cannot_copy_back(self) -> str | None:
        """Why the destination's ranks cannot hand what they hold to other ranks (no ``read`` method), or ``None``."""
        target = _lacking(self.destination, self.read)
        if target is None:
            return None
        return (
            f"{target.__name__} has no {self.read!r} method returning {{name: tensor}} of the weights it holds "
            f"(WeightSync(read=...) names it)"
        )

    def copy_back(self, holders: Any, into: Any, version: Any) -> TransferReport:
        """Give ``into`` (destination ranks) the weights ``holders`` (destination ranks too) hold, tagged ``version``.

        What a grow does when the old ranks hold ``version`` already: the new ranks get those bytes, not
        the source's current ones.  Names are the destination's (no rename, cast or subset again).
        """
        peer = WeightSync(
            holders, into, offer=self.read, apply=self.apply, want=self.want, lend=self.lend,
            bucket_bytes=self.bucket_bytes, read=self.read,
        )  # fmt: skip
        return peer(version)

    @property
    def transport(self) -> str:
        """How the bytes go: the source backend's name where both executors share a link, else ``"driver"``."""
        src, dst = self.source.executor, self.destination.executor
        address = src.tensor_address()
        if address is not None and dst.can_receive_tensors(address):
            return str(src.name)
        return "driver"

    def __call__(self, version: Any) -> TransferReport:
        """Transfer every weight now; the destinations read ``version`` once it all arrived."""
        with self._lock:
            return self._run(version)

    def verify(self) -> list[str]:
        """Check that every destination holds the bytes the sources offer now; the names checked.

        Each source rank digests the regions it holds (from its ``offer``
        method) and each destination rank the regions it wants (from its
        ``read`` method, default ``"weights"``: ``{name: tensor}`` of what it
        holds, whole or its slice); only digests travel.  Raises
        :class:`WeightMismatchError` naming each differing parameter and
        destination rank (and source replicas that differ among themselves).
        """
        with self._lock:
            src, dst = self._side("source", self.source), self._side("destination", self.destination)
            tid = (os.getpid() << 20) + next(_ids)
            ok = False
            try:
                held, tensors, wants = self._ask(src, dst, tid)
                plan = plan_transfer(held, tensors, wants, _WHOLE)
                names = _verify.check(src, dst, tid, plan, held, tensors, self.read)
                ok = True
            finally:
                _end(src, dst, tid, ok)
            return names

    def start(self, version: Any) -> TransferFuture:
        """The same transfer in the background (generation can go on meanwhile)."""
        future: concurrent.futures.Future[TransferReport] = concurrent.futures.Future()

        def run() -> None:
            try:
                future.set_result(self(version))
            except BaseException as exc:  # noqa: BLE001 - handed to whoever waits on the future
                future.set_exception(exc)

        context = contextvars.copy_context()  # an open trace block records it too
        threading.Thread(target=context.run, args=(run,), name="dispatchcore-weight-sync", daemon=True).start()
        return TransferFuture(future)

    # -- one transfer ---------------------------------------------------------------
    def _side(self, role: str, wg: Any) -> Side:
        wg.ensure_usable()
        return Side.of(role, wg)

    def _run(self, version: Any) -> TransferReport:
        started = time.monotonic()
        src, dst = self._side("source", self.source), self._side("destination", self.destination)
        transport = self.transport
        if transport == "driver" and not self._warned:
            self._warned = True
            _log.warning(
                "weight transfer %s -> %s goes through the driver (slow): the %r executor has no tensor link to %r",
                src.label, dst.label, src.executor.name, dst.executor.name,
            )  # fmt: skip
        tid = (os.getpid() << 20) + next(_ids)
        timeline = Timeline(f"WeightSync {src.track} -> {dst.track} (version {version!r})")
        ok = False
        try:
            with timeline.driver("plan"):
                held, tensors, wants = self._ask(src, dst, tid)
                plan = self._plan(held, tensors, wants)
            how = (_hook(dst, self.apply), not dst.isolate, _hook(dst, self.lend))
            begins: list[Any] = [(plan.wanted[d], *how) for d in range(len(dst.ranks))]
            self._held = _NONE  # from the first bucket on, the ranks may hold different weights until the commit
            with timeline.driver("buckets"):
                driver_bytes = _move(plan, src, dst, tid, begins, transport == "driver", timeline)
            if self.verify_each:  # before the version: a transfer whose bytes differ never sets it
                with timeline.driver("verify"):
                    whole = plan_transfer(held, tensors, wants, _WHOLE)
                    _verify.check(src, dst, tid, whole, held, tensors, self.read)
            with timeline.driver("commit"):
                commits = [(("commit", tid, version, begin),) for begin in begins]
                committed = submit(dst, range(len(dst.ranks)), commits)
                if src.executor is dst.executor:  # colocated roles share the state: the source's end comes after
                    wait(dst, committed, "commit")
                ended = submit(src, range(len(src.ranks)), [(("end", tid),)] * len(src.ranks))
                wait(dst, committed, "commit")
                timeline.ranks(src, range(len(src.ranks)), wait(src, ended, "commit"))
            self._held = version
            ok = True
        finally:
            if not ok:
                _end(src, dst, tid, ok)
            timeline.close(transport=transport, ok=ok)
        seconds = time.monotonic() - started
        return TransferReport(
            version, transport, len(tensors), len(plan.buckets), plan.nbytes, driver_bytes, seconds, self.verify_each,
            timeline.phases,
        )  # fmt: skip

    def _plan(self, held: list[dict[str, Held]], tensors: dict[str, TensorSpec], wants: list[Any]) -> TransferPlan:
        """The last plan where nothing it was made of changed (planning hundreds of names costs milliseconds)."""
        made = (held, tensors, wants, self.bucket_bytes)
        if self.last_plan is None or self._planned != made:
            self.last_plan, self._planned = plan_transfer(held, tensors, wants, self.bucket_bytes), made
        return self.last_plan

    def _ask(self, src: Side, dst: Side, tid: int) -> tuple[list[dict[str, Held]], dict[str, TensorSpec], list[Any]]:
        """What every source rank holds (an offer it cannot take refused by name), the specs, what each wants.

        ``want`` goes beside ``layout`` with the last transfer's shapes, and again only where they changed.
        """
        layout = (("layout", tid, src.prefix + self.offer),)
        asked = submit(src, range(len(src.ranks)), [layout] * len(src.ranks))
        guess, early = self._shapes, None
        if guess is not None:
            early = submit(
                dst, range(len(dst.ranks)), [(("want", tid, _hook(dst, self.want), guess),)] * len(dst.ranks)
            )
        try:
            held = wait(src, asked, "layout")
        except WorkerError as exc:
            _quietly(early)
            refused = BY_NAME.get(exc.exc_type)
            if refused is None:
                raise
            raise refused(
                f"source group {src.label} rank {exc.rank} offers weights it cannot send: {exc.exc_message}"
            ) from exc
        tensors = self._tensors(held)
        shapes = {name: (spec.full_shape, spec.dtype) for name, spec in tensors.items()}
        if early is not None and shapes == guess:
            wants = wait(dst, early, "want")
        else:
            _quietly(early)
            step = (("want", tid, _hook(dst, self.want), shapes),)
            wants = wait(dst, submit(dst, range(len(dst.ranks)), [step] * len(dst.ranks)), "want")
        self._shapes = shapes
        return held, tensors, wants

    def _tensors(self, held: list[dict[str, Held]]) -> dict[str, TensorSpec]:
        """Destination name → spec, in the sources' order: the subset, renamed, cast."""
        out: dict[str, TensorSpec] = {}
        seen: dict[str, str] = {}
        for offered in held:
            for name, h in offered.items():
                if name in seen or not _keep(self.names, name):
                    continue
                target = _renamed(self.rename, name)
                seen[name] = target or ""
                if target is None:
                    continue
                if target in out:
                    raise DispatchError(f"weights {out[target].source_name!r} and {name!r} are both renamed {target!r}")
                dtype = _dtype(self.dtype, target, h.dtype)
                out[target] = TensorSpec(name, h.full_shape, dtype)
        return out


def _lacking(wg: Any, name: str | None) -> type | None:
    """The class of ``wg``'s ranks (the role's class for a colocated role) when it has no ``name``, else ``None``.

    Read on the class; a class with its own ``__getattr__`` may make the method on the fly, so it is
    left to the ranks.
    """
    cls = getattr(wg, "worker_cls", None)
    if name is None or not isinstance(cls, type):
        return None
    prefix = str(getattr(wg, "role_prefix", "") or "")
    roles: Mapping[str, type] = getattr(cls, "_dispatchcore_roles", None) or {}
    target = roles.get(prefix[:-1], cls) if prefix else cls
    if getattr(target, name, None) is not None or any("__getattr__" in vars(k) for k in target.__mro__[:-1]):
        return None
    return target


def _check_apply(wg: Any, name: str | None) -> None:
    """Refuse, before anything moves, a destination whose class has no ``name`` (a misspelt ``load_weights``).

    ``None`` is the core's hand-over: no method applies, the tensors wait on the rank.
    """
    if name is None:
        return
    target = _lacking(wg, name)
    if target is None:
        return
    known = [n for n in dir(target) if not n.startswith("_") and callable(getattr(target, n, None))]
    raise DispatchAttributeError(
        f"WeightSync: the destination's class {target.__name__} has no method {name!r} to apply the weights "
        f"with{did_you_mean(name, known)}; define {target.__name__}.{name}(self, named_tensors) or name the one "
        f"it has: WeightSync(..., apply='<method name>'). Nothing was moved"
    )


def _dtype(dtypes: Dtypes | None, name: str, held: torch.dtype) -> torch.dtype:
    """The dtype ``name`` arrives in: a mapping names it; one dtype casts floating-point tensors only."""
    if isinstance(dtypes, Mapping):
        return dtypes.get(name, held)
    return dtypes if dtypes is not None and held.is_floating_point else held


def _keep(names: Names | None, name: str) -> bool:
    if names is None:
        return True
    return bool(names(name)) if callable(names) else name in names


def _renamed(rename: Rename | None, name: str) -> str | None:
    if rename is None:
        return name
    if callable(rename):
        return rename(name)
    return rename.get(name, name)


def _quietly(handle: Any) -> None:
    """Let a step no answer is needed from finish (its error, if any, is the next step's to report)."""
    if handle is not None:
        try:
            handle.result()
        except Exception:  # noqa: BLE001, S110 - see above
            pass


def _move(
    plan: TransferPlan, src: Side, dst: Side, tid: int, begins: list[Any], through_driver: bool, timeline: Timeline
) -> int:
    """Every bucket, at most two per source rank in flight; the bytes that crossed the driver.

    A bucket's ``move`` step goes to its destinations as soon as its source
    packed it; on each destination it starts receiving that bucket, then
    applies the one it received before (and, for its last, this one too):
    each destination runs its steps in order, so the next bucket is on its
    way while the current one is applied.  A destination's first step tells
    it ``begins[d]`` (then ``None``).
    """
    window = 2 * max(1, len(src.ranks))
    pending = deque(plan.buckets)
    packing: deque[tuple[Bucket, Any]] = deque()
    moving: deque[tuple[Bucket, Any]] = deque()
    left = Counter(d for bucket in plan.buckets for d in bucket.destinations)
    unapplied: dict[int, int] = {}  # a destination's bucket received and not applied yet
    crossed = 0
    while pending or packing or moving:
        while pending and len(packing) + len(moving) < window:
            bucket = pending.popleft()
            packing.append((bucket, submit(src, [bucket.source], [(("pack", tid, bucket),)])))
        if not packing:
            _moved(src, dst, timeline, *moving.popleft())
            continue
        bucket, handle = packing.popleft()
        token = wait(src, handle, "pack")[0]
        if through_driver:
            count_received_bytes(bucket.nbytes)
            count_sent_bytes(bucket.nbytes * len(bucket.destinations))
            crossed += bucket.nbytes * (1 + len(bucket.destinations))
        steps = []
        for d in bucket.destinations:
            left[d] -= 1
            apply = [unapplied.pop(d)] if d in unapplied else []
            if left[d]:
                unapplied[d] = bucket.index
            else:
                apply.append(bucket.index)
            steps.append((("move", tid, bucket, begins[d], apply), token))
            begins[d] = None
        moving.append((bucket, submit(dst, bucket.destinations, steps)))
        while moving and moving[0][1].done():
            _moved(src, dst, timeline, *moving.popleft())
    return crossed


def _moved(src: Side, dst: Side, timeline: Timeline, bucket: Bucket, handle: Any) -> None:
    timeline.ranks(dst, bucket.destinations, wait(dst, handle, "move", source=src))


def _end(src: Side, dst: Side, tid: int, ok: bool) -> None:
    """Drop the transfer's state on every rank (after a failure: briefly, whoever still answers)."""
    bound = None if ok else 2.0
    handles = []
    for side in (src, dst):
        try:
            handles.append(submit(side, range(len(side.ranks)), [(("end", tid),)] * len(side.ranks)))
        except Exception:  # noqa: BLE001 - a broken or closed group keeps nothing to drop
            if ok:
                raise
    for handle in handles:
        try:
            handle.result(bound)
        except Exception:  # noqa: BLE001 - a dead rank holds no state
            if ok:
                raise


def _hook(side: Side, name: str | None) -> str | None:
    """A hook's method name on ``side``'s ranks (a role's is prefixed); ``None``: no hook."""
    return None if name is None else side.prefix + name
