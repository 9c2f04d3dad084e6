"""Unit test of internal parts (the torchrun store, the gloo transport): imports executors_torchrun._spawn, _transport.

A self-started torchrun world listens on loopback only.

Its store carries pickles that ranks unpickle, so a port reachable from the
network would let anyone who can reach the machine run code in a rank.
Listening sockets are read from ``/proc`` (no ``ss``/``psutil`` needed).
"""

from __future__ import annotations

import fcntl
import gc
import ipaddress
import os
import re
import socket
import struct
import sys
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from dispatchcore import Dispatch, Worker, WorkerGroup, available_backends, register
from dispatchcore.executor import LOOPBACK, gloo_group
from executors_torchrun._spawn import start_store

pytestmark = [
    pytest.mark.skipif(not Path("/proc/self/net/tcp").exists(), reason="needs Linux /proc"),
    pytest.mark.timeout(120),
]

_LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp{,6}
_SIOCGIFADDR = 0x8915


def listening(pid: int) -> list[tuple[str, int]]:
    """``(address, port)`` of every TCP socket process ``pid`` holds in the listening state."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            match = re.fullmatch(r"socket:\[(\d+)\]", os.readlink(fd))
        except OSError:  # closed while we looked
            continue
        if match:
            inodes.add(match.group(1))
    found = []
    for table, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        path = Path(f"/proc/{pid}/net/{table}")
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] != _LISTEN or fields[9] not in inodes:
                continue
            address, port = fields[1].split(":")
            found.append((_address(address, family), int(port, 16)))
    return found


def _address(hex_words: str, family: int) -> str:
    """Decode /proc's address: 32-bit words, each in the machine's byte order."""
    raw = b"".join(
        bytes.fromhex(hex_words[i : i + 8])[:: -1 if sys.byteorder == "little" else 1]
        for i in range(0, len(hex_words), 8)
    )
    return socket.inet_ntop(family, raw)


def is_loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


def network_interface() -> str | None:
    """A non-loopback interface with an IPv4 address, or ``None``."""
    for _, name in socket.if_nameindex():
        if name == "lo":
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            try:
                fcntl.ioctl(sock.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:  # no IPv4 address
                continue
        return name
    return None


class Echo(Worker):
    @register(Dispatch.ONE_TO_ALL)
    def echo(self, t: torch.Tensor) -> torch.Tensor:
        return t + self.rank

    @register(Dispatch.ONE_TO_ALL)
    def pid(self) -> int:
        return os.getpid()


@pytest.fixture
def interface(monkeypatch: pytest.MonkeyPatch) -> str:
    """Point ``GLOO_SOCKET_IFNAME`` at a network interface (child processes inherit it).

    gloo's default device then binds to that interface's address; without it,
    gloo binds to what the hostname resolves to, which may be loopback anyway.
    """
    name = network_interface()
    if name is None:
        pytest.skip("no network interface with an IPv4 address")
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", name)
    return name


def _gloo_listeners(loopback: bool) -> list[tuple[str, int]]:
    before = set(listening(os.getpid()))
    group = gloo_group(dist.HashStore(), 0, 1, timedelta(seconds=10), loopback)
    try:
        return sorted(set(listening(os.getpid())) - before)
    finally:
        del group


def test_loopback_gloo_group_ignores_network_interface(interface: str) -> None:
    found = _gloo_listeners(loopback=True)
    assert found and all(is_loopback(address) for address, _ in found), found


def test_torchrun_gloo_group_keeps_default_device(interface: str) -> None:
    """Under the real launcher ranks may be on several nodes: loopback must not be forced."""
    found = _gloo_listeners(loopback=False)
    assert found and not any(is_loopback(address) for address, _ in found), found


@pytest.mark.slow
@pytest.mark.parametrize("gloo_ifname", [False, True], ids=["default", "GLOO_SOCKET_IFNAME"])
def test_self_started_world_listens_on_loopback_only(gloo_ifname: bool, request: pytest.FixtureRequest) -> None:
    if "torchrun" not in available_backends():
        pytest.skip("torchrun backend unavailable")
    if gloo_ifname:
        request.getfixturevalue("interface")
    before = set(listening(os.getpid()))  # whatever earlier tests left in this process
    wg = WorkerGroup(Echo, 2, backend="torchrun")
    try:
        payload = torch.arange(1 << 16)
        results = wg.echo(payload)  # tensors through gloo: the pairs to the driver are connected
        assert [int(r[1] - payload[1]) for r in results] == [0, 1]
        ranks = wg.pid()
        assert len({os.getpid(), *ranks}) == 3, ranks
        sockets = {os.getpid(): sorted(set(listening(os.getpid())) - before)}
        sockets.update({pid: listening(pid) for pid in ranks})
    finally:
        wg.shutdown()
    assert all(sockets.values()), f"every process should listen (store, gloo): {sockets}"
    exposed = {pid: [s for s in found if not is_loopback(s[0])] for pid, found in sockets.items()}
    assert not any(exposed.values()), f"listening outside loopback: {exposed}"


@pytest.mark.slow
def test_store_port_closes_at_shutdown() -> None:
    if "torchrun" not in available_backends():
        pytest.skip("torchrun backend unavailable")
    before = set(listening(os.getpid()))
    wg = WorkerGroup(Echo, 1, backend="torchrun")
    wg.echo(torch.ones(4))
    assert set(listening(os.getpid())) - before, "the world's store and gloo should listen while it runs"
    wg.shutdown()
    assert set(listening(os.getpid())) - before == set(), "a port stayed open after shutdown"


def test_store_is_bound_to_loopback() -> None:
    """Regression: ``TCPStore(host, 0, is_master=True)`` listens on every interface."""
    store = start_store()
    port = store.port
    assert [address for address, p in listening(os.getpid()) if p == port] == [LOOPBACK]
    client = dist.TCPStore(LOOPBACK, port, None, False, timedelta(seconds=10))
    client.set("k", "v")
    assert store.get("k") == b"v"
    del client, store
    gc.collect()
    # The store owned the descriptor and closed it (no leaked fd, no ResourceWarning).
    assert [p for _, p in listening(os.getpid()) if p == port] == []
