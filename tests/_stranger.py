"""A stranger on this machine, for the torchrun trust tests: a separate process that attacks a running group.

``python tests/_stranger.py pickles HOST PORT MARKER``: connect to the c10d store at HOST:PORT as anyone
can, and push a pickle that would create MARKER onto every key the library once read its own messages
from (rows, replies, joins, stops, the weight and row bridges' queues), under every world prefix the
store lists, and set the lane keys to it.  Prints how many world prefixes it found and how many keys it pushed to.

``python tests/_stranger.py knock PORT...``: connect to each port on loopback; where a lane greets (the
door, the driver's hub), answer its challenge as rank 1 with a secret of its own.  Prints one line per
port: ``PORT refused`` (a lane that turned it away), ``PORT admitted`` (a lane that let it in: a bug),
or ``PORT silent`` (no lane).  ``watch PID SECONDS``: hold an idle connection to every lane PID listens on
now (the driver's hub must not wait on it), then for SECONDS knock on every port PID starts listening
on (a door opened by a grow), printing the same lines.
"""

from __future__ import annotations

import concurrent.futures
import os
import pickle
import re
import secrets
import socket
import sys
import time
from datetime import timedelta

#: Queues the library's processes once popped pickles from (``<prefix><name>``), before issue 39.
OLD_QUEUES = [
    *(f"{kind}/{d}" for kind in ("rows", "rowsre", "join") for d in range(8)),
    "stop",
    "transport",
    *(f"rowsbridge/{secrets.token_hex(16)}" for _ in range(2)),
]
#: The weight bridge's request queues lived on the raw store, named by a bridge id.
OLD_RAW_QUEUES = [f"dispatchcore-bridge/serve/{secrets.token_hex(16)}" for _ in range(2)]
_MAGIC = b"dispatchcore-lane/1"


class Marker:
    """Unpickling this creates the marker file: proof that a process ran what the stranger sent."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return (open, (self.path, "w"))


def push_pickles(host: str, port: int, marker: str) -> tuple[int, int]:
    import torch.distributed as dist

    store = dist.TCPStore(host, port, None, False, timedelta(seconds=30), wait_for_workers=False)
    payload = pickle.dumps(Marker(marker))
    keys = store.list_keys()
    prefixes = sorted({k[: -len("ready")] for k in keys if k.endswith("/ready")})  # each world's, as the store lists it
    pushed = 0
    for prefix in prefixes:
        for name in OLD_QUEUES:
            store.queue_push(prefix + name, payload)
            pushed += 1
        for key in keys:
            if key.startswith(prefix + "lane/"):
                store.set(key, payload)
    for name in OLD_RAW_QUEUES:
        store.queue_push(name, payload)
        pushed += 1
    return len(prefixes), pushed


def knock(port: int, greeting: float = 3.0) -> tuple[str, socket.socket | None]:
    """What a listener on ``port`` did with a rank that does not know the secret (waiting ``greeting`` s for a lane)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.settimeout(greeting)
    try:
        hello = sock.recv(len(_MAGIC) + 32, socket.MSG_WAITALL)
    except OSError:
        hello = b""
    if not hello.startswith(_MAGIC):
        return "silent", sock
    sock.settimeout(3.0)
    ours = secrets.token_bytes(32)
    sock.sendall((1).to_bytes(8, "little") + ours + secrets.token_bytes(32))  # an answer without the secret
    try:
        proof = sock.recv(32)
    except OSError:
        proof = b""
    sock.close()
    return ("admitted" if proof else "refused"), None


def listening(pid: int | None = None) -> list[tuple[str, int]]:
    """``(address, port)`` of every TCP socket ``pid`` holds listening (``None``: any process's), from ``/proc``."""
    inodes = None if pid is None else _socket_inodes(pid)
    found = []
    for table, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        try:
            with open(f"/proc/{pid or 'self'}/net/{table}") as rows:
                lines = rows.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == "0A" and (inodes is None or fields[9] in inodes):  # TCP_LISTEN
                address, port = fields[1].split(":")
                words, step = bytes.fromhex(address), -1 if sys.byteorder == "little" else 1
                raw = b"".join(words[i : i + 4][::step] for i in range(0, len(words), 4))
                found.append((socket.inet_ntop(family, raw), int(port, 16)))
    return found


def knock_as_another_user(pid: int, *, loopback_only: bool = False) -> dict[str, str]:
    """From a process without our environment, knock on every port ``pid`` listens on: ``{port: verdict}``.

    ``loopback_only``: only ports bound to loopback (where the library's own doors are; Ray's servers are not).
    """
    import subprocess

    at_loopback = ("127.", "::ffff:127.")
    ports = [str(port) for host, port in listening(pid) if not loopback_only or host.startswith(at_loopback)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("DISPATCHCORE")}
    knocked = subprocess.run(
        [sys.executable, __file__, "knock", *ports], capture_output=True, text=True, timeout=120, check=True, env=env
    )
    return dict(line.split() for line in knocked.stdout.splitlines())


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            match = re.fullmatch(r"socket:\[(\d+)\]", os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:  # closed while we looked
            continue
        if match:
            inodes.add(match.group(1))
    return inodes


def watch(pid: int, seconds: float) -> None:
    """Hold an idle connection to every lane ``pid`` listens on now; for ``seconds``, knock on each new port of it.

    Only ``pid``'s ports are touched (the machine is shared); another user would scan ``/proc/net/tcp``.
    """
    seen = {port for _, port in listening(pid)}
    idle = []
    for port in sorted(seen):
        verdict, sock = knock(port, greeting=0.2)
        if verdict != "silent":
            idle.append(socket.create_connection(("127.0.0.1", port), timeout=5))
            print(port, verdict, flush=True)
        if sock is not None:
            sock.close()
    print("watching", flush=True)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for _, port in listening(pid):
            if port not in seen:
                seen.add(port)
                try:
                    verdict, sock = knock(port)
                except OSError:  # it closed again meanwhile
                    continue
                print(port, verdict, flush=True)
                if sock is not None:
                    sock.close()
    for sock in idle:
        sock.close()


def main() -> None:
    command, args = sys.argv[1], sys.argv[2:]
    if command == "pickles":
        print(*push_pickles(args[0], int(args[1]), args[2]), flush=True)
    elif command == "watch":
        watch(int(args[0]), float(args[1]))
    else:  # every port at once: each silent one waits out its greeting, side by side
        with concurrent.futures.ThreadPoolExecutor(max(1, len(args))) as pool:
            for port, (verdict, sock) in zip(args, pool.map(knock, map(int, args)), strict=True):
                print(port, verdict, flush=True)
                if sock is not None:
                    sock.close()


if __name__ == "__main__":
    main()
