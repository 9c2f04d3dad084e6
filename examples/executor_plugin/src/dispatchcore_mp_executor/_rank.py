"""The rank side: one spawned process per rank, running its calls in order.

A reader thread drains the pipe into a queue the whole time (so the driver's
sends never wait for a running call) and ends the process when the driver
closes the pipe or dies; a watchdog ends it if the driver's process goes
away without the pipe closing.  The main thread builds the worker with a
:class:`~dispatchcore.executor.WorkerHost` and answers every call with
``(ok, value)``.  The reader answers ``stacks`` and acts on ``cancel``
itself, so both reach a rank while its main thread is in a call.
"""

from __future__ import annotations

import os
import queue
import signal
import sys
import threading
import time
from multiprocessing.connection import Connection
from typing import Any

import torch

from dispatchcore import wire
from dispatchcore.executor import RemoteFailure, StoreCollective, WorkerHost, cancel_in_process, thread_stacks

from . import _pipe

#: Message kinds, driver to rank.  A ``None`` header asks the rank to leave.
START, RUN = "start", "run"
#: Answered by the reader thread at once, beside a running call: where the main thread is.
STACKS = "stacks"
#: Acted on by the reader thread at once (no answer): stop the call whose ``Instructions.call_id`` it names.
CANCEL = "cancel"
#: The reader thread and the main thread both answer on the pipe: one send at a time.
_SEND_LOCK = threading.Lock()
PARENT_POLL_S = 1.0


def rank_main(conn: Connection, rank: int, world_size: int, env: dict[str, str]) -> None:
    """Entry point of a rank process (the target ``multiprocessing`` spawns)."""
    os.environ.update(env)  # this process's own environment; the driver's stays untouched
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the driver's to handle
    if torch.cuda.is_available():  # docs/design.md, "Invariants": the LOCAL_RANK device is current before __init__
        torch.cuda.set_device(int(env["LOCAL_RANK"]) % torch.cuda.device_count())
    inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
    threading.Thread(target=_read_driver, args=(conn, inbox), name="mp-rank-inbox", daemon=True).start()
    threading.Thread(target=_watch_parent, args=(os.getppid(),), name="mp-rank-watchdog", daemon=True).start()
    host: WorkerHost | None = None
    while (message := inbox.get()) is not None:
        (call_id, kind, method, instructions, arg_slots, kwarg_slots), parts = message
        try:
            values = [_pipe.decode(part) for part in parts]
            if kind == START:
                worker_cls, init_args, init_kwargs = values[0]
                host = WorkerHost(worker_cls, rank, world_size, init_args, init_kwargs)
                host.collective = StoreCollective.from_environment("multiprocess", os.environ)
                failure = host.start()
                ok, value = failure is None, failure
            else:
                assert host is not None, "a call arrived before the worker was built"
                args = tuple(values[i] for i in arg_slots)
                kwargs = {name: values[i] for name, i in kwarg_slots.items()}
                ok, value = host.run(method, args, kwargs, instructions)
        except BaseException as exc:  # noqa: BLE001 - e.g. an argument that cannot be unpickled here
            ok, value = False, RemoteFailure.capture(rank, method, exc)
        if not _reply(conn, rank, method, call_id, ok, value):
            break
    if host is not None:
        host.close()
    conn.close()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip tearing down torch at interpreter exit (about a second): nothing is left to do


def _reply(conn: Connection, rank: int, method: str, call_id: int, ok: bool, value: Any) -> bool:
    """Send one call's outcome; ``False`` once the driver is gone."""
    try:
        part = wire.dumps(value)
    except BaseException as exc:  # noqa: BLE001 - an unpicklable result fails the call, not the rank
        failure = RemoteFailure.unpicklable(rank, method, "result", exc, in_process=False, value=value)
        ok, part = False, wire.dumps(failure)
    try:
        with _SEND_LOCK:
            _pipe.send(conn, (call_id, ok), [part])
    except OSError:
        return False
    return True


def _read_driver(conn: Connection, inbox: queue.SimpleQueue[Any]) -> None:
    """Queue the driver's messages; leave at once when the pipe closes (the driver is gone)."""
    try:
        while (message := _pipe.recv(conn))[0] is not None:
            header, parts = message
            if header[1] == STACKS:  # never queued behind a running call
                all_threads = bool(_pipe.decode(parts[0]))
                _reply(conn, -1, header[2], header[0], True, thread_stacks(threading.main_thread().ident, all_threads))
                continue
            if header[1] == CANCEL:  # the running call, or a queued one (the main thread then skips it)
                cancel_in_process(header[3].call_id)
                continue
            inbox.put(message)
    except (EOFError, OSError):
        os._exit(0)
    inbox.put(None)  # asked to leave: after the calls already queued


def _watch_parent(ppid: int) -> None:
    """Leave if the driver's process is gone even though the pipe is not closed."""
    while os.getppid() == ppid:
        time.sleep(PARENT_POLL_S)
    os._exit(0)
