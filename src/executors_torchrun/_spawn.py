"""Self-started ranks, for running outside torchrun (tests, notebooks).

The driver hosts a ``TCPStore`` on loopback and starts one fresh interpreter
per rank (never ``fork``: pytest, Ray and torch hold threads), with
torchrun-style variables in its own environment and the driver's
``sys.path``.  The driver's lane secret reaches a child on its stdin pipe
(never its environment, arguments or the store), and a child exits when
that pipe closes, however the driver dies (``_child``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from dispatchcore import DispatchRuntimeError, DispatchTimeoutError
from dispatchcore.executor import (
    LOOPBACK,
    RANK_ENV_KEYS,
    cpu_thread_environment,
    free_port,
    lane_secret,
    listening_store,
    rank_environment,
    use_lane_secret,
)

from ._protocol import READY_KEY

BOOT_ENV = "DISPATCHCORE_TORCHRUN_BOOT"
_CHILD_CODE = "from executors_torchrun._child import main; main()"


def start_store(host: str = LOOPBACK) -> dist.TCPStore:
    """A store hosted by the driver on a free port of ``host`` only (a self-started world's: loopback)."""
    store: dist.TCPStore = listening_store(host, 300.0)
    return store


class OutputRelay:
    """Copies each child's stdout/stderr lines to the driver's, prefixed ``(group rank g)`` (or ``spare``).

    One daemon thread per stream, ending at end of file (the child exited).
    """

    def __init__(self, group: str) -> None:
        self._group = group
        self._labels: dict[int, str] = {}
        self.threads: list[threading.Thread] = []

    def label(self, data_rank: int, text: str) -> None:
        self._labels[data_rank] = text

    def attach(self, data_rank: int, proc: subprocess.Popen[bytes]) -> None:
        for stream, sink in ((proc.stdout, "stdout"), (proc.stderr, "stderr")):
            if stream is None:
                continue
            thread = threading.Thread(
                target=self._relay,
                args=(data_rank, stream, sink),
                name=f"dispatchcore-output{data_rank}-{sink}",
                daemon=True,
            )
            thread.start()
            self.threads.append(thread)

    def _relay(self, data_rank: int, stream: Any, sink: str) -> None:
        try:
            for raw in iter(stream.readline, b""):
                label = self._labels.get(data_rank, "spare")
                out = getattr(sys, sink)  # looked up per line: pytest and notebooks swap it
                try:
                    out.write(f"({self._group} {label}) {raw.decode(errors='replace')}")
                    out.flush()
                except (OSError, ValueError):  # the driver's stream is closed: drop the line
                    pass
        finally:
            stream.close()

    def join(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))


def spawn_ranks(
    world_size: int, boot: Boot, spares: int = 0, relay: OutputRelay | None = None
) -> dict[int, subprocess.Popen[bytes]]:
    """Start ``world_size`` ranks plus ``spares``; the child of group rank ``g`` is data rank ``g + 1``.

    Spares (data ranks ``world_size + 1 ..``) get no rank variables: the
    driver sends them with the rank they take over (its ``join`` message).
    """
    master_port = free_port(LOOPBACK)
    members = list(range(1, world_size + spares + 1))  # the driver moves no rows: not a member
    processes: dict[int, subprocess.Popen[bytes]] = {}
    for rank in range(world_size + spares):
        ranks = (
            rank_environment(rank, world_size, master_addr=LOOPBACK, master_port=master_port)
            if rank < world_size
            else {}
        )
        processes[rank + 1] = spawn_process(rank + 1, dataclasses.replace(boot, members=members), ranks, relay)
        if relay is not None and rank < world_size:
            relay.label(rank + 1, f"rank {rank}")
    return processes


@dataclass(frozen=True)
class Boot:
    """What a self-started process needs to join its world: the store, the driver's hub, the transport's generation."""

    store_port: int
    prefix: str
    #: The world's identity and where the driver's hub listens (``_hub``).
    world: str
    hub_port: int
    transport_timeout: float
    #: The data ranks of the generation it joins (``_transport``).
    members: list[int]
    generation: int
    #: The group's size, which sets each process's share of the CPU threads.
    world_size: int


def spawn_process(
    data_rank: int, boot: Boot, ranks: dict[str, str], relay: OutputRelay | None
) -> subprocess.Popen[bytes]:
    """Start the process of ``data_rank`` (``ranks``: its rank variables; none for a spare)."""
    inherited = {k: v for k, v in os.environ.items() if k not in RANK_ENV_KEYS}
    inherited.update(cpu_thread_environment(boot.world_size))  # spares take a rank's place: same share
    settings = {
        "host": LOOPBACK,
        "port": boot.store_port,
        "prefix": boot.prefix,
        "world": boot.world,
        "hub": boot.hub_port,
        "data_rank": data_rank,
        "members": boot.members,
        "generation": boot.generation,
        "timeout": boot.transport_timeout,
        "path": [p for p in sys.path if p],
    }
    env = {**inherited, **ranks, "GROUP_RANK": "0", BOOT_ENV: json.dumps(settings)}
    if relay is not None:
        env["PYTHONUNBUFFERED"] = "1"  # lines reach the driver as they are printed
    pipe = subprocess.PIPE if relay is not None else None
    proc = subprocess.Popen(  # noqa: S603 - our own interpreter and module
        [sys.executable, "-c", _CHILD_CODE],
        env=env,
        stdin=subprocess.PIPE,
        stdout=pipe,
        stderr=pipe,
        close_fds=True,
    )
    if relay is not None:
        relay.attach(data_rank, proc)
    assert proc.stdin is not None  # noqa: S101 - a pipe, asked for above
    try:
        proc.stdin.write(lane_secret().hex().encode() + b"\n")
        proc.stdin.flush()
    except OSError:  # it died at once: the start reports its exit
        pass
    return proc


def wait_ready(
    store: dist.Store, count: int, timeout: float, late: str, processes: dict[int, subprocess.Popen[bytes]]
) -> None:
    """Wait until ``count`` processes are up (``late``: the error after ``timeout`` s); fail fast if a child exits."""
    deadline = time.monotonic() + timeout
    while int(store.add(READY_KEY, 0)) < count:
        for rank, proc in processes.items():
            code = proc.poll()
            if code is not None:
                raise DispatchRuntimeError(f"rank {rank - 1} exited with code {code} while starting")
        if time.monotonic() > deadline:
            raise DispatchTimeoutError(late)
        time.sleep(0.02)


def reap(processes: dict[int, subprocess.Popen[bytes]], wait: float) -> None:
    """Close the pipes (children leave), wait up to ``wait`` s, then kill what is left."""
    for proc in processes.values():
        if proc.stdin is not None:
            try:
                proc.stdin.close()
            except OSError:
                pass
    deadline = time.monotonic() + wait
    for proc in processes.values():
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
    for proc in processes.values():
        try:
            proc.wait(5.0)
        except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL is not ignorable
            pass


def child_main(secret: bytes) -> None:
    """A self-started rank, once ``_child`` watches the driver: join the world, serve with the driver's ``secret``."""
    use_lane_secret(secret)
    boot = json.loads(os.environ.pop(BOOT_ENV))
    sys.path[:] = list(dict.fromkeys([*boot["path"], *sys.path]))
    from ._protocol import FOREVER_S
    from ._rank_process import Home, serve_and_exit

    client = dist.TCPStore(boot["host"], boot["port"], None, False, timedelta(seconds=FOREVER_S))
    store = dist.PrefixStore(boot["prefix"], client)
    timeout = timedelta(seconds=boot["timeout"])
    serve_and_exit(
        store,
        Home(boot["world"], boot["data_rank"], (LOOPBACK, boot["hub"])),
        boot["members"],
        timeout,
        launched=False,
        loopback=True,
        generation=boot["generation"],
    )
