"""A cancel ends a blocking system call where the process's main thread runs the methods.

Self-started torchrun ranks run their methods on the main thread: a cancel
the method does not answer within 1 s sends it a signal, which ends
``time.sleep``, a socket's ``recv`` or a subprocess wait in
``CallInterrupted``.  The methods would block for an hour and the group's
``cancel_grace`` is past the test's timeout: a rank left blocked would make
the next call wait and then fail, so the next call answering from the same
pids proves the signal freed it.  The gate's own cases (a late signal, a
user's handler, another thread) run here, on pytest's main thread.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import cloudpickle
import pytest

from dispatchcore import CallCancelledError, Dispatch, Worker, WorkerGroup, available_backends, register
from dispatchcore._runtime._cancel import GATE, INTERRUPT_SIGNAL
from dispatchcore.executor import Instructions, WorkerHost, install_cancel_signal

cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.skipif(INTERRUPT_SIGNAL is None, reason="no real-time signals on this platform")
HOUR = 3600.0
#: Past the test's timeout: a rank the signal did not free fails the test instead of being restarted.
GRACE_S = 600.0


class Blocker(Worker):
    """Methods blocked in a system call, and a note of what ended each."""

    def __init__(self) -> None:
        self.count = 0
        self.seen: list[str] = []

    @contextlib.contextmanager
    def noting(self) -> Iterator[None]:
        try:
            yield
        except BaseException as exc:
            self.seen.append(type(exc).__name__)
            raise

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def bump(self) -> tuple[int, int]:
        self.count += 1
        return os.getpid(), self.count

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def outcomes(self) -> list[str]:
        seen, self.seen = self.seen, []
        return seen

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def sleep_in_c(self) -> None:
        with self.noting():
            time.sleep(HOUR)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def recv_in_c(self) -> None:
        ours, theirs = socket.socketpair()
        with ours, theirs, self.noting():
            ours.recv(1)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def wait_in_c(self) -> None:
        with self.noting():
            subprocess.run(["sleep", str(int(HOUR))], check=False)  # noqa: S603, S607


@pytest.fixture(scope="module")
def torchrun_group() -> Iterator[WorkerGroup[Any]]:
    if "torchrun" not in available_backends():
        pytest.skip("torchrun is not installed")
    with WorkerGroup(Blocker, 2, backend="torchrun", cancel_grace=GRACE_S) as wg:
        yield wg


def _wait_until_in(wg: WorkerGroup[Any], function: str) -> None:
    while not all(f"in {function}" in text for text in wg.rank_stacks().values()):
        time.sleep(0.05)


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "method, blocked_in", [("sleep_in_c", "sleep_in_c"), ("recv_in_c", "recv_in_c"), ("wait_in_c", "wait")]
)
def test_a_cancelled_torchrun_call_blocked_in_c_leaves_the_same_processes_taking_calls(
    torchrun_group: WorkerGroup[Any], method: str, blocked_in: str
) -> None:
    before = torchrun_group.bump()
    future = getattr(torchrun_group, method)()
    _wait_until_in(torchrun_group, blocked_in)
    assert future.cancel() is True
    with pytest.raises(CallCancelledError, match=f"{method!r} was cancelled"):
        future.get()
    assert torchrun_group.outcomes() == [["CallInterrupted"]] * 2
    assert torchrun_group.bump() == [(pid, count + 1) for pid, count in before]


# -- the gate on this process's main thread ----------------------------------------------------


@pytest.fixture
def main_thread_signal() -> Iterator[int]:
    """The handler on pytest's main thread for one test, then the signal as it was."""
    assert INTERRUPT_SIGNAL is not None
    assert install_cancel_signal() is True
    try:
        yield INTERRUPT_SIGNAL
    finally:
        signal.signal(INTERRUPT_SIGNAL, signal.SIG_DFL)
        GATE.signal_thread = None


class Sleeper:
    """A worker run here by a ``WorkerHost``, on the main thread."""

    def __init__(self) -> None:
        self.asleep = threading.Event()

    def sleep(self) -> str:
        self.asleep.set()
        time.sleep(HOUR)
        return "woke"

    def signal_myself(self, signum: int) -> str:
        """A late signal arrives while this call runs: it is not this call's, so nothing happens."""
        signal.pthread_kill(threading.get_ident(), signum)
        time.sleep(0.05)
        return "undisturbed"


def _run(host: WorkerHost, method: str, *args: Any, call_id: int) -> tuple[bool, Any]:
    return host.run(method, args, {}, Instructions(call_id=call_id))


@pytest.mark.timeout(60)
def test_a_cancel_ends_a_main_thread_sleep_and_a_late_signal_touches_no_other_call(main_thread_signal: int) -> None:
    host = WorkerHost(Sleeper, 0, 1)
    assert host.start() is None
    canceller = threading.Thread(target=lambda: (host.worker.asleep.wait(), host.cancel(101, interrupt_after=0.0)))
    canceller.start()
    ok, failure = _run(host, "sleep", call_id=101)
    canceller.join()
    assert not ok and failure.exc_type == "CallInterrupted"
    signal.pthread_kill(threading.get_ident(), main_thread_signal)  # late: no call runs
    assert _run(host, "signal_myself", main_thread_signal, call_id=102) == (True, "undisturbed")


@pytest.mark.timeout(60)
def test_a_handler_of_the_process_own_is_left_alone_and_other_threads_get_none() -> None:
    assert INTERRUPT_SIGNAL is not None
    mine = []
    signal.signal(INTERRUPT_SIGNAL, lambda signum, frame: mine.append(signum))
    try:
        assert install_cancel_signal() is False
        signal.pthread_kill(threading.get_ident(), INTERRUPT_SIGNAL)
        time.sleep(0.01)  # the handler runs at the next instruction
        assert mine == [INTERRUPT_SIGNAL]
    finally:
        signal.signal(INTERRUPT_SIGNAL, signal.SIG_DFL)
    installed: list[bool] = []
    thread = threading.Thread(target=lambda: installed.append(install_cancel_signal()))
    thread.start()
    thread.join()
    assert installed == [False]
    assert signal.getsignal(INTERRUPT_SIGNAL) is signal.SIG_DFL
    assert GATE.signal_thread is None
