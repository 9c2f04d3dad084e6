"""The driver's side of a world: commands out, statuses and results in.

One :class:`Hub` per world (the whole torchrun launch, or one set of
self-started ranks).  Commands and statuses travel on one control link per
rank (``_control``).  Each other rank gets a reader thread that reads its
statuses in order and drains the results' payloads at once, so a rank is
never left blocked sending a result nobody asked for yet.  Answers go to a
:class:`Receiver` (a call handle) at the position the command named.

Liveness: a rank's link ending fails every call waiting on it, once the
reader has taken every status the rank sent before it went (named by its
exit code or torn canary connection when the monitor has seen those).  The
monitor thread also fails them itself shortly after it sees the process gone,
in case the link outlives it (a forked child holding the socket).  Under
torchrun ranks are not children, so it also
reads their heartbeats; a silent rank fails only the calls whose own
``death_timeout`` has passed (each receiver carries its group's), so groups
sharing the launch's hub never change each other's bound.  Heartbeats are
read as often as the shortest bound waiting needs.  The monitor also marks
each rank it knows dead in the store (``dead/<rank>``), where ranks fetching
lazy results' rows from it look (``_row_plane``).
"""

from __future__ import annotations

import itertools
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

import torch.distributed as dist

from dispatchcore import DispatchError
from dispatchcore.executor import LaneLink, liveness_poll

from ._control import accept_ranks
from ._protocol import STOPPING_KEY, dead_key, decode, encode, heartbeat_key
from ._row_plane import RowPlane
from ._transport import TagCounter, Transport
from ._wire import Packed, adopt_views, unpack

#: How often the monitor polls self-started processes (seconds).
PROCESS_POLL_S = 0.1
#: How often it reads heartbeats under torchrun, at most (shorter bounds waiting read more often).
HEARTBEAT_POLL_S = 1.0
#: A rank seen gone whose link is still open has its calls failed this much later (the reader's grace).
GONE_GRACE_S = 0.3
#: How long a reader whose link closed waits for the monitor to say why (exit code, torn canary).
REASON_WAIT_S = 1.0


class Receiver(Protocol):
    """Where the answers to one command go (a call handle); ``position`` is the rank's place in the call."""

    #: Seconds of heartbeat silence after which this call gives the rank up.
    death_timeout: float

    def deliver(self, position: int, ok: bool, value: Any) -> None: ...

    def rank_died(self, position: int, detail: str) -> None: ...

    def targets(self, position: int, layout: Any) -> tuple[dict[int, Any], dict[str, Any]] | None:
        """Where to receive a DataProto result's tensor buffers, and the views they become."""
        ...


#: At stop, how long to wait for a stopped rank's process to be gone.
EXIT_WAIT_S = 3.0


class Hub:
    """Sends commands to ranks 1.. and routes their statuses to waiting calls."""

    def __init__(
        self,
        store: dist.Store,
        transport: Transport,
        *,
        processes: dict[int, subprocess.Popen[bytes]] | None = None,
        host: str,
        connect_timeout: float,
    ) -> None:
        """``host``: the address ranks connect to for their control links (loopback for a one-machine world)."""
        self.store = store
        self.transport = transport
        self.size = transport.size
        self.remote = list(range(1, self.size))
        self._processes = processes
        self._lock = threading.Lock()
        self._pending: dict[int, dict[int, tuple[Receiver, int]]] = {d: {} for d in self.remote}
        #: Per rank and command: the sends carrying its arguments and the values they read (see ``command``).
        self._sends: dict[int, dict[int, tuple[list[Any], Any]]] = {d: {} for d in self.remote}
        #: Per rank: (heartbeat count, when it last changed), under torchrun.
        self._beats: dict[int, tuple[int, float]] = {}
        self._dead: dict[int, str] = {}
        self._stopped = {d: threading.Event() for d in self.remote}
        self._closing = threading.Event()
        self._cids = itertools.count()
        #: This process's row traffic, when it hosts workers (worker 0 under torchrun); stopped with the hub.
        self.rows: RowPlane | None = None
        self._rank_tags = TagCounter(1)
        self._stop_requested = False
        self._gone: dict[int, str] = {}
        #: Set once a rank's process is gone (its gloo connection closed).
        self._exited = {d: threading.Event() for d in self.remote}
        #: (host, pid) each stopping rank reported, to see its process end on this host.
        self._processes_seen: dict[int, tuple[str, int]] = {}
        self._links: dict[int, LaneLink] = accept_ranks(
            store, self.remote, host, connect_timeout, gone=self._exit_reason
        )
        self._canary_threads = [
            threading.Thread(
                target=self._canary, args=(rank, work), name=f"dispatchcore-torchrun-canary{rank}", daemon=True
            )
            for rank, work in transport.post_canaries().items()
        ]
        for thread in self._canary_threads:
            thread.start()
        self._readers = [
            threading.Thread(target=self._read, args=(d,), name=f"dispatchcore-torchrun-reader{d}", daemon=True)
            for d in self.remote
        ]
        for reader in self._readers:
            reader.start()
        self._monitor = threading.Thread(target=self._watch, name="dispatchcore-torchrun-monitor", daemon=True)
        self._monitor.start()

    # -- sending ------------------------------------------------------------------
    def next_cid(self) -> int:
        return next(self._cids)

    def row_plane(self) -> RowPlane:
        """This process's row plane, started on first use (a self-started world's driver keeps no rows)."""
        with self._lock:
            if self.rows is None:
                if self._closing.is_set():
                    raise DispatchError("this torchrun world was stopped")
                self.rows = RowPlane(self.store, self.transport)
            return self.rows

    def dead_reason(self, rank: int) -> str | None:
        return self._dead.get(rank)

    def retire(self, rank: int, detail: str) -> None:
        """The driver ended ``rank``'s process itself (a replaced rank): its calls fail now, ``stop`` skips it.

        A killed torch process takes a moment (~1 s on a busy machine) to
        finish dying, and only then would the monitor see it gone; a
        ``stop`` in between would send it a stop it never acknowledges and
        wait its whole bound for it.
        """
        self._fail_rank(rank, detail)

    def command(
        self,
        rank: int,
        message: tuple[Any, ...],
        answer: tuple[Receiver, int] | None = None,
        cid: int | None = None,
        sends: tuple[list[Any], Any] | None = None,
    ) -> None:
        """Queue ``message`` for ``rank``; ``answer`` (receiver, position) hears the answer to ``cid``.

        ``sends`` (works, what they read): the command's argument payloads,
        posted by :meth:`send_value`.  A rank answers ``ok`` only after it has
        received every argument, so the reader completes them on that answer
        (already finished: no wait, no hand-off to the reaper's thread); any
        other ending leaves them to the reaper.
        """
        registered = False
        with self._lock:
            reason = self._dead.get(rank)
            if reason is None and self._stop_requested:
                reason = "the world was stopped (driver exiting)"
            if reason is None and answer is not None and cid is not None:
                self._pending[rank][cid] = answer
                registered = True
                if sends is not None and sends[0]:
                    self._sends[rank][cid] = sends
                    sends = None
        if reason is None:
            # Sent outside the lock: a rank busy in a long call may leave the send waiting for room.
            try:
                self._links[rank].send(encode(message))
            except OSError as exc:
                reason = f"its connection to the driver failed ({exc})"
                if registered and cid is not None:
                    with self._lock:
                        if self._pending[rank].pop(cid, None) is None:
                            answer = None  # already answered (the rank was failed meanwhile)
                        sends = self._sends[rank].pop(cid, None)
        if sends is not None:
            self.transport.reaper.add(*sends)
        if reason is not None and answer is not None:
            answer[0].rank_died(answer[1], reason)

    def send_value(self, packed: Packed, rank: int, works: list[Any] | None = None) -> int:
        """Post a value's payload to ``rank``; returns the first tag to name in the command.

        With ``works`` the posted sends are added to it (the caller hands them
        to :meth:`command`); without, the reaper completes them.
        """
        first = self.transport.sent.take(packed.header.tags)
        if rank not in self._dead and packed.header.tags:
            posted = self.transport.post(packed, rank, first)
            if works is None:
                self.transport.reaper.add(posted, packed)
            else:
                works.extend(posted)
        return first

    # -- receiving ------------------------------------------------------------------
    def _read(self, rank: int) -> None:
        link = self._links[rank]
        while True:
            try:
                message = decode(link.recv())
            except Exception as exc:  # noqa: BLE001 - the link ended: the rank left, died, or the hub stops
                self._link_ended(rank, exc)
                return
            kind = message[0]
            if kind == "stopped":
                if len(message) == 3:
                    self._processes_seen[rank] = (message[1], message[2])
                self._stopped[rank].set()
            elif kind == "done":
                self._done(rank, *message[1:])

    def _link_ended(self, rank: int, exc: BaseException) -> None:
        """After every status the rank sent: fail its waiting calls, unless it was told to stop."""
        if self._closing.is_set() or self._stop_requested or self._stopped[rank].is_set():
            return
        deadline = time.monotonic() + REASON_WAIT_S
        detail = self._dead.get(rank) or self._gone_reason(rank)
        while detail is None and time.monotonic() < deadline:
            time.sleep(0.01)
            detail = self._dead.get(rank) or self._gone_reason(rank)
        self._fail_rank(rank, detail or f"its process is gone (its connection to the driver closed: {exc})")

    def _done(self, rank: int, cid: int, ok: bool, payload: Any, first: int, layout: Any = None) -> None:
        with self._lock:
            answer = self._pending[rank].pop(cid, None)
            sends = self._sends[rank].pop(cid, None)
        if sends is not None:
            if ok:
                _complete(sends[0])
            else:  # it may have failed before receiving them all
                self.transport.reaper.add(*sends)
        value = payload
        if ok and payload is not None:  # None: the value None, no payload (most calls without data)
            # Drained even when nobody waits any more, so the rank is never left blocked sending.
            placed = answer[0].targets(answer[1], layout) if answer is not None and layout else None
            targets, views = placed if placed is not None else (None, None)
            try:
                if payload.sizes or payload.device_specs:
                    buffers, device = self.transport.recv(payload, rank, first, self._rank_tags, targets)
                else:
                    buffers, device = [], []
                value = unpack(payload, buffers, device)
                if views:
                    adopt_views(value, views)
            except Exception as exc:  # noqa: BLE001 - a torn connection: the rank is dying
                detail = f"its result could not be received ({exc})"
                self._fail_rank(rank, detail)
                if answer is not None:
                    answer[0].rank_died(answer[1], detail)
                return
        if answer is not None:
            answer[0].deliver(answer[1], ok, value)

    def _fail_rank(self, rank: int, detail: str) -> None:
        with self._lock:
            self._dead.setdefault(rank, detail)
            answers = list(self._pending[rank].values())
            self._pending[rank].clear()
            self._release_sends(rank)
        self._stopped[rank].set()
        for receiver, position in answers:
            receiver.rank_died(position, detail)

    def _watch(self) -> None:
        """Turn a dead process into a ``dead`` status; under torchrun, read heartbeats too."""
        store = self.store.clone()  # type: ignore[attr-defined]  # Store.clone is missing from torch's stubs
        beats_read = 0.0
        marked: set[int] = set()
        gone_since: dict[int, float] = {}
        failed: set[int] = set()
        while not self._closing.wait(PROCESS_POLL_S):
            now = time.monotonic()
            for rank in self.remote:
                since = gone_since.get(rank)
                if since is None:
                    detail = None if rank in self._dead else self._gone_reason(rank)
                    if detail is not None:
                        # Its reader fails the waiting calls when the link ends, after the statuses sent before.
                        self._dead.setdefault(rank, detail)
                        gone_since[rank] = now
                elif rank not in failed and now - since >= GONE_GRACE_S:
                    failed.add(rank)  # the link outlived the process: fail them here
                    self._fail_rank(rank, self._dead[rank])
            self._mark_dead(store, marked)
            now = time.monotonic()
            if self._processes is None and not self._stop_requested and now - beats_read >= self._beat_poll():
                beats_read = now
                self._read_heartbeats(store)

    def _mark_dead(self, store: dist.Store, marked: set[int]) -> None:
        """Mark the ranks known dead in the store, once each (ranks fetching rows from them look there)."""
        for rank, detail in list(self._dead.items()):
            if rank not in marked:
                try:
                    store.set(dead_key(rank), detail.encode())  # type: ignore[arg-type]  # the binding takes bytes
                except Exception:  # noqa: BLE001 - the store is gone: so is every rank's wait on it
                    return
                marked.add(rank)

    def _gone_reason(self, rank: int) -> str | None:
        """Why ``rank``'s process is certainly gone, or ``None``."""
        if self._stop_requested:
            return None
        gone = self._gone.get(rank)
        if gone is not None:
            return gone
        if not self._stopped[rank].is_set():
            return self._exit_reason(rank)
        return None

    def _exit_reason(self, rank: int) -> str | None:
        """``"its process exited with code N"`` for a self-started rank that exited, else ``None``."""
        if self._processes is not None:
            code = self._processes[rank].poll()
            if code is not None:
                return f"its process exited with code {code}"
        return None

    def _beat_poll(self) -> float:
        """Seconds between heartbeat reads: often enough for the shortest bound of a waiting call."""
        with self._lock:
            bounds = [receiver.death_timeout for answers in self._pending.values() for receiver, _ in answers.values()]
        return min(HEARTBEAT_POLL_S, liveness_poll(min(bounds))) if bounds else HEARTBEAT_POLL_S

    def _read_heartbeats(self, store: dist.Store) -> None:
        """Note each rank's heartbeat; fail the calls that waited past their own ``death_timeout``."""
        now = time.monotonic()
        expired: list[tuple[Receiver, int, str]] = []
        for rank in self.remote:
            if rank in self._dead:
                continue
            try:
                latest = int(store.add(heartbeat_key(rank), 0))
            except Exception as exc:  # noqa: BLE001
                self._dead.setdefault(rank, f"the store is unreachable ({exc})")
                self._fail_rank(rank, self._dead[rank])
                continue
            count, changed_at = self._beats.get(rank, (-1, now))
            if latest != count:
                changed_at = now
            self._beats[rank] = (latest, changed_at)
            silence = now - changed_at
            with self._lock:
                pending = self._pending[rank]
                for cid, (receiver, position) in list(pending.items()):
                    if silence > receiver.death_timeout:
                        del pending[cid]
                        sends = self._sends[rank].pop(cid, None)
                        if sends is not None:
                            self.transport.reaper.add(*sends)
                        expired.append((receiver, position, f"no heartbeat for {silence:.0f} s"))
        for receiver, position, detail in expired:
            receiver.rank_died(position, detail)

    def _canary(self, rank: int, work: Any) -> None:
        """Wait on the rank's canary receive: it ends only when the rank leaves or dies."""
        try:
            work.wait()
        except Exception as exc:  # noqa: BLE001 - the torn connection is the news
            self._gone[rank] = f"its process is gone (connection to the driver closed: {_gloo_reason(exc)})"
            self._exited[rank].set()
            return
        self._gone[rank] = "it left without being told to stop"
        # A leaving rank sent its canary; the next receive fails when its
        # process has really exited (the driver waits for that at stop, so
        # torchrun's agent never sees the driver leave first and kill it).
        try:
            self.transport.post_canary(rank).wait()
        except Exception:  # noqa: BLE001, S110 - the expected end
            pass
        finally:
            self._exited[rank].set()

    @property
    def closed(self) -> bool:
        return self._stop_requested

    def wait_for_dead(self, wait: float) -> tuple[int, str] | None:
        """The first rank known dead, waiting up to ``wait`` s for the monitor to notice one."""
        deadline = time.monotonic() + wait
        while True:
            if self._dead:
                rank = min(self._dead)
                return rank, self._dead[rank]
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.05)

    # -- stopping -------------------------------------------------------------------
    def stop(self, wait: float, on_stopped: Callable[[], None] | None = None) -> None:
        """Tell every rank to stop, wait up to ``wait`` s for them, then end the readers."""
        if self._closing.is_set():
            return
        self._stop_requested = True
        try:
            self.store.set(STOPPING_KEY, b"1")  # type: ignore[arg-type]  # the binding takes bytes; the stub says str
        except Exception:  # noqa: BLE001, S110 - the store is gone; the links still tell
            pass
        for rank in self.remote:
            if self._exit_reason(rank) is not None:  # its process ended (killed for a replacement): none to wait for
                self._stopped[rank].set()
                self._exited[rank].set()
            elif rank not in self._dead:
                try:
                    self._links[rank].send(encode(("stop",)))
                except OSError:  # the rank is gone already
                    self._stopped[rank].set()
        deadline = time.monotonic() + wait
        for rank in self.remote:
            self._stopped[rank].wait(max(0.0, deadline - time.monotonic()))
        for rank in self.remote:
            if self._stopped[rank].is_set():
                until = min(time.monotonic() + EXIT_WAIT_S, deadline)
                self._exited[rank].wait(max(0.0, until - time.monotonic()))
                host, pid = self._processes_seen.get(rank, ("", 0))
                if host == socket.gethostname():
                    _wait_process_ended(pid, until)
        with self._lock:
            self._closing.set()
            rows, self.rows = self.rows, None  # it holds the store: dropped so release_store frees it
        if rows is not None:
            rows.close()
        if on_stopped is not None:
            on_stopped()
        for link in self._links.values():
            link.close()  # ends each reader (it sees the hub closing)
        for reader in self._readers:
            reader.join(1.0)
        self._abandon_pending("the group was shut down while this call ran")
        self._monitor.join(1.0)
        for thread in self._canary_threads:
            thread.join(1.0)
        self.transport.reaper.drain(1.0)
        self.transport.close()

    def _abandon_pending(self, detail: str) -> None:
        """End every call still waiting for an answer: none can come once the readers are gone."""
        with self._lock:
            answers = [answer for pending in self._pending.values() for answer in pending.values()]
            for pending in self._pending.values():
                pending.clear()
            for rank in self.remote:
                self._release_sends(rank)
        for receiver, position in answers:
            receiver.rank_died(position, detail)

    def _release_sends(self, rank: int) -> None:
        """Hand ``rank``'s outstanding argument sends to the reaper (they fail or finish there); under the lock."""
        for sends in self._sends[rank].values():
            self.transport.reaper.add(*sends)
        self._sends[rank].clear()

    def release_store(self) -> None:
        """After ``stop``: let go of the store, so a self-started world's store port closes now."""
        self.store = None  # type: ignore[assignment]


def _complete(works: list[Any]) -> None:
    """Wait on sends known to be finished (a gloo send reports completion only through ``wait``)."""
    for work in works:
        try:
            work.wait()
        except Exception:  # noqa: BLE001, S112 - the peer is gone; its death is reported elsewhere
            continue


def _wait_process_ended(pid: int, until: float) -> None:
    """Poll ``/proc`` until ``pid`` has exited (gone or a zombie), or ``until``.

    A rank's connection closes a little before its process ends; under
    torchrun a driver that exits in that gap (with an error) makes the agent
    SIGTERM the rank and report it as failed too.  Best effort: only for a
    rank on this host, and only where ``/proc`` exists.
    """
    while time.monotonic() < until:
        try:
            with open(f"/proc/{pid}/stat", "rb") as stat:
                state = stat.read().rpartition(b")")[2].split()[0]
        except (OSError, IndexError):
            return
        if state in (b"Z", b"X"):
            return
        time.sleep(0.005)


def _gloo_reason(exc: BaseException) -> str:
    """gloo's error text without its source location and sign-off ("... [file:line] Connection closed ...")."""
    lines = str(exc).strip().splitlines()
    text = lines[-1] if lines else type(exc).__name__
    if "] " in text:
        text = text.split("] ", 1)[1]
    return text.split(". ")[0].strip()
