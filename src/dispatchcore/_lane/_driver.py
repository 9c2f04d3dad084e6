"""The driver's side of a group's lane: each rank's pending calls, one reader, one liveness rule.

See ``docs/executor-contract.md`` ("The lane").
"""

from __future__ import annotations

import functools
import itertools
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from .._base import DispatchTimeoutError, WorkerDiedError
from .._runtime import RankCallHandle, RemoteFailure, note_stacks_soon
from .._spi import Call
from .._wire import RowBuffers, Serialized
from ._address import LaneAddress
from ._door import open_lane
from ._envelope import BulkPath, Part, inline, is_bulk, open_part, pack_call
from ._framing import unframe_object
from ._link import LaneLink
from ._messages import BESIDE, CALL, CANCEL, CONTROL_LINK, DONE, PING, PONG, STACKS, START
from ._reader import LinkReader
from ._rows import RowPlan

#: A rank whose process is seen dead while its links stay open is given up this much later.
GONE_GRACE_S = 0.3
#: How long a link's end waits for the process-death signal to name the cause.
REASON_WAIT_S = 1.0
#: Says why rank ``rank``'s process is certainly gone, or ``None`` (the executor's death signal).
RankDead = Callable[[int], str | None]
#: Hears that rank ``rank`` was found gone, and why.
RankGone = Callable[[int, str], None]


class LaneCallHandle(RankCallHandle):
    """One call on the lane: the reader delivers answers; the base owns every bound; liveness asks the lane."""

    def __init__(self, lane: LaneDriver, call: Call) -> None:
        super().__init__(call, death_timeout=lane.death_timeout, on_broken=lane.on_broken)
        self.lane = lane
        #: Each result that came by the executor's bulk path: its token (an executor may hand results on from there).
        self.bulk_results: dict[int, Any] = {}
        #: Where large DataProto results land when the collect concatenates them anyway (``_rows``).
        self.rows: RowPlan | None = None
        if call.results_are_copied:
            self.row_buffers = RowBuffers()
            self.rows = RowPlan(len(call.ranks), self.row_buffers)

    def check_alive(self, waiting: list[int]) -> None:
        for position in waiting:
            detail = self.lane.silent(self.call.ranks[position], self.death_timeout)
            if detail is not None:
                self.rank_died(position, detail)


class _Rank:
    """One rank's two links, the calls awaiting its answers, and what its pings and process say."""

    def __init__(self, rank: int, calls: LaneLink, control: LaneLink) -> None:
        self.rank = rank
        self.calls = calls
        self.control = control
        self.lock = threading.Lock()
        self.pending: dict[int, tuple[RankCallHandle, int]] = {}
        self.asked: dict[int, tuple[threading.Event, list[str]]] = {}
        self.ended: str | None = None
        self.unanswered_since: float | None = None
        self.last_ping = 0.0
        self.pings = itertools.count()
        self.dead_since: float | None = None
        #: Its process no longer serves ``rank`` (replaced or removed): its end is not the rank's to report.
        self.retired = False


class LaneDriver:
    """A group's lane on the driver: ``join`` ranks, ``start`` their workers, then ``submit`` calls."""

    def __init__(
        self,
        host: str,
        *,
        death_timeout: float,
        on_broken: Callable[[str], None] = lambda reason: None,
        rank_dead: RankDead | None = None,
        on_gone: RankGone | None = None,
        bulk: BulkPath | None = None,
        isolate: bool = True,
        name: str = "group",
        reason_wait: float = REASON_WAIT_S,
    ) -> None:
        """``isolate``: the group's; results a bulk path hands over in shared memory are then copied.

        ``reason_wait``: how long a closed link waits for ``rank_dead`` to say why (a backend that learns
        of a lost node only by health checks needs longer than one that sees a process exit).
        """
        self._reason_wait = reason_wait
        self.host = host
        self.death_timeout = death_timeout
        self.on_broken = on_broken
        self._rank_dead = rank_dead
        self._on_gone = on_gone
        self._bulk = bulk
        self._isolate = isolate
        self._ranks: dict[int, _Rank] = {}
        self._cids = itertools.count(1)
        #: Held while ranks change processes (``retire``, ``renumber``, and the executor's own mapping) and while
        #: ``on_gone`` runs: a late death report of a rank's old process never names the process now serving it.
        self.membership = threading.RLock()
        self._reader = LinkReader(f"dispatchcore-lane-{name}", self._on_message, self._on_end)

    def join(self, ranks: Sequence[int], launch: Callable[[LaneAddress], None], timeout: float) -> None:
        """Open the door, ``launch(address)`` (start or tell the ranks), accept both links of each of ``ranks``.

        A replaced rank's old links end; raises ``DispatchTimeoutError`` (``ranks``: those that never connected,
        ``method``: ``None``), or ``DispatchError`` for a rank gone.
        """
        expected = [*ranks, *(rank | CONTROL_LINK for rank in ranks)]
        dead = self._rank_dead or (lambda rank: None)
        for rank in ranks:  # usually retired already by the executor, before it gave the rank another process
            self.retire([rank], f"rank {rank} was replaced")
        with open_lane(self.host) as door:
            launch(door.address)
            links = door.accept(expected, timeout, dead, rank_of=lambda who: who & ~CONTROL_LINK)
        for rank in ranks:
            entry = self._ranks[rank] = _Rank(rank, links[rank], links[rank | CONTROL_LINK])
            entry.calls.place_with(functools.partial(self._place, entry))
            self._reader.add(entry, (entry.calls, entry.control))

    def retire(self, ranks: Sequence[int], reason: str) -> None:
        """End ``ranks``' links before other processes take them (``reason``); their old ends report nothing.

        Call it holding :attr:`membership` while the executor maps the ranks to their new processes.
        """
        with self.membership:
            for rank in ranks:
                entry = self._ranks.get(rank)
                if entry is not None:
                    entry.retired = True
                    self._end(entry, reason, found=False)

    def renumber(self, keep: Sequence[int], reason: str) -> None:
        """After a shrink: end the links of the ranks not in ``keep`` (``reason``); number ``keep``'s ``0..k-1``."""
        kept = set(keep)
        with self.membership:
            self.retire([rank for rank in self._ranks if rank not in kept], reason)
            self._ranks = {new: self._ranks[old] for new, old in enumerate(keep)}
            for new, entry in self._ranks.items():
                entry.rank = new

    def start(self, ranks: Sequence[int], boot: Serialized, world_size: int, timeout: float) -> None:
        """Build the worker on each of ``ranks`` from ``boot``; raises what ``__init__`` or the wait raised."""
        n = len(ranks)
        handle = LaneCallHandle(self, Call("__init__", tuple(ranks), [()] * n, [{}] * n))
        cid = next(self._cids)
        part = inline(boot)
        for position, rank in enumerate(ranks):
            self._send(rank, handle, position, cid, (START, cid, part, world_size, self._isolate))
        try:
            handle.result(timeout)
        except DispatchTimeoutError as exc:  # slow or deadlocked: where each unfinished rank is says which
            note_stacks_soon(lambda asked, within: self.stacks(asked, False, within), exc, exc.ranks)
            raise

    def submit(self, call: Call, handle: LaneCallHandle | None = None) -> LaneCallHandle:
        """Send ``call`` to its ranks at once (all pickled first); ``handle``: the executor's own, else a plain one."""
        shares = pack_call(call, self._bulk)
        handle = LaneCallHandle(self, call) if handle is None else handle
        cid = next(self._cids)
        method, instructions = call.method, call.instructions
        kind, beside = (BESIDE, True) if call.beside else (CALL, False)  # beside: the control link, never queued
        for position, (rank, (parts, args, kwargs)) in enumerate(zip(call.ranks, shares, strict=True)):
            self._send(rank, handle, position, cid, (kind, cid, method, instructions, parts, args, kwargs), beside)
        return handle

    def _send(
        self,
        rank: int,
        handle: RankCallHandle,
        position: int,
        cid: int,
        message: tuple[Any, ...],
        beside: bool = False,
    ) -> None:
        entry = self._ranks.get(rank)
        if entry is None:
            handle.rank_died(position, f"rank {rank} has no lane link")
            return
        with entry.lock:  # registered before sending: the answer may come back at once
            ended = entry.ended
            if ended is None:
                entry.pending[cid] = (handle, position)
        if ended is not None:
            handle.rank_died(position, ended)
            return
        try:
            (entry.control if beside else entry.calls).send_object(message)
        except OSError:
            pass  # the link broke: the reader sees it end and fails the call

    def cancel(self, call_id: int, ranks: Sequence[int]) -> bool:
        """Ask ``ranks`` to stop call ``call_id`` (``cancel_in_process`` there); whether any was asked."""
        return sum(self._control(rank, (CANCEL, call_id)) for rank in ranks) > 0

    def stacks(self, ranks: Sequence[int], all_threads: bool, timeout: float) -> dict[int, str]:
        """Each rank's method-thread stack (every thread's with ``all_threads``); silent ranks are left out."""
        sid = next(self._cids)
        boxes: dict[int, tuple[threading.Event, list[str]]] = {}
        for rank in ranks:
            entry = self._ranks.get(rank)
            if entry is not None:
                box = entry.asked[sid] = (threading.Event(), [])
                if self._control(rank, (STACKS, sid, all_threads)):
                    boxes[rank] = box
        deadline = time.monotonic() + timeout
        out: dict[int, str] = {}
        for rank, (answered, text) in boxes.items():
            if answered.wait(max(0.0, deadline - time.monotonic())):
                out[rank] = text[0]
        for rank in ranks:
            entry = self._ranks.get(rank)
            if entry is not None:
                entry.asked.pop(sid, None)
        return out

    def _control(self, rank: int, message: tuple[Any, ...]) -> bool:
        entry = self._ranks.get(rank)
        if entry is None or entry.ended is not None:
            return False
        try:
            entry.control.send_object(message)
        except OSError:
            return False
        return True

    def ended(self, rank: int) -> str | None:
        """Why ``rank`` is known gone, else ``None``: takes no lock and sends nothing (safe in a signal handler)."""
        entry = self._ranks.get(rank)
        return None if entry is None else entry.ended

    def silent(self, rank: int, death_timeout: float) -> str | None:
        """Why ``rank`` counts as gone, else ``None`` (and a ping sent when one is due)."""
        entry = self._ranks.get(rank)
        if entry is None or entry.ended is not None:
            return None if entry is None else entry.ended
        now = time.monotonic()
        reason = self._rank_dead(rank) if self._rank_dead is not None else None
        if reason is not None:
            if entry.dead_since is None:
                entry.dead_since = now  # answers it sent before it went may still be on their way
            elif now - entry.dead_since >= GONE_GRACE_S:
                self._end(entry, reason)
                return reason
            return None
        since = entry.unanswered_since
        if since is not None and now - since > death_timeout:
            reason = f"it has not answered a liveness ping for {death_timeout:g} s (death_timeout)"
            self._end(entry, reason)
            return reason
        if now - entry.last_ping >= max(0.01, death_timeout / 4):
            entry.last_ping = now
            if since is None:
                entry.unanswered_since = now
            self._control(rank, (PING, next(entry.pings)))
        return None

    def _on_message(self, entry: _Rank, raw: bytearray) -> None:
        message = unframe_object(raw)
        kind = message[0]
        if kind == DONE:
            _, cid, ok, part = message
            with entry.lock:
                waiter = entry.pending.pop(cid, None)
            if waiter is None:
                return
            if is_bulk(part):  # a bulk path may take a while: not on the thread every rank's answers wait on
                threading.Thread(target=self._deliver, args=(entry, waiter, ok, part), daemon=True).start()
            else:
                self._deliver(entry, waiter, ok, part)
        elif kind == PONG:
            entry.unanswered_since = None
        elif kind == STACKS:
            box = entry.asked.get(message[1])
            if box is not None:
                box[1].append(message[2])
                box[0].set()

    def _place(self, entry: _Rank, note: bytes, sizes: list[int]) -> dict[int, memoryview] | None:
        """Where an answer's batch tensors land (the rows of its call's output), on the reader's thread."""
        if not note:
            return None
        cid, layout = note[:8], note[8:]
        with entry.lock:
            waiter = entry.pending.get(int.from_bytes(cid, "little"))
        if waiter is None or not isinstance(waiter[0], LaneCallHandle) or waiter[0].rows is None:
            return None
        return waiter[0].rows.targets(waiter[1], layout, sizes)

    def _deliver(self, entry: _Rank, waiter: tuple[RankCallHandle, int], ok: bool, part: Part | None) -> None:
        handle, position = waiter
        if is_bulk(part) and isinstance(handle, LaneCallHandle):
            handle.bulk_results[position] = part[1]  # type: ignore[index]
        try:
            value = open_part(part, self._bulk, self._isolate and not handle.call.results_are_copied)
            if isinstance(handle, LaneCallHandle) and handle.rows is not None:
                handle.rows.adopt(position, value)
        except WorkerDiedError as exc:  # the bulk path found the rank gone before its result was read
            handle.rank_died(position, exc.detail)
            return
        except BaseException as exc:  # noqa: BLE001 - e.g. a result class the driver cannot import
            ok, value = False, RemoteFailure.capture(entry.rank, handle.call.method, exc)
        handle.deliver(position, ok, value)

    def _on_end(self, entry: _Rank) -> None:
        """A link of ``entry`` ended: the rank is gone (named by the death signal when it speaks soon)."""
        if entry.ended is not None or self._rank_dead is None:
            self._end(entry, "its process is gone (its lane link to the driver closed)")
            return
        threading.Thread(target=self._end_named, args=(entry,), name="dispatchcore-lane-end", daemon=True).start()

    def _end_named(self, entry: _Rank) -> None:
        assert self._rank_dead is not None  # noqa: S101 - only started with a death signal
        deadline = time.monotonic() + self._reason_wait
        reason = self._rank_dead(entry.rank)
        while reason is None and time.monotonic() < deadline and entry.ended is None:
            time.sleep(0.01)
            reason = self._rank_dead(entry.rank)
        self._end(entry, reason or "its process is gone (its lane link to the driver closed)")

    def _end(self, entry: _Rank, reason: str, found: bool = True) -> None:
        """Close ``entry``'s links once and fail what waits on it; ``found``: gone by itself (``on_gone`` hears)."""
        with entry.lock:
            if entry.ended is not None:
                return
            entry.ended = reason
            pending, entry.pending = entry.pending, {}
        entry.calls.close()
        entry.control.close()
        for handle, position in pending.values():
            handle.rank_died(position, reason)
        if found and self._on_gone is not None:
            with self.membership:
                if not entry.retired:
                    self._on_gone(entry.rank, reason)

    def close(self, reason: str = "the group was shut down") -> None:
        """End every rank's links (their waiting calls fail with ``reason``) and the reader."""
        for entry in list(self._ranks.values()):
            self._end(entry, reason, found=False)
        self._reader.stop()
