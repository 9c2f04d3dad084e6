"""The store ``StoreCollective.serve`` starts for a group's collectives listens on the host asked, nowhere else.

torch's ``TCPStore(host, 0, is_master=True)`` listens on every interface whatever ``host`` says, and a
store has no authentication: an executor that asks for loopback must get loopback only.
"""

from __future__ import annotations

import socket
import sys

from dispatchcore.executor import LOOPBACK, StoreCollective


def _listeners() -> set[tuple[str, int]]:
    found = set()
    for table, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        try:
            with open(f"/proc/self/net/{table}") as rows:  # noqa: PTH123 - procfs
                lines = rows.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] != "0A":  # TCP_LISTEN
                continue
            address, port = fields[1].split(":")
            words, step = bytes.fromhex(address), -1 if sys.byteorder == "little" else 1
            raw = b"".join(words[i : i + 4][::step] for i in range(0, len(words), 4))
            found.add((socket.inet_ntop(family, raw), int(port, 16)))
    return found


def test_the_collective_store_listens_on_loopback_only() -> None:
    store, value = StoreCollective.serve(LOOPBACK)
    port = int(value.rpartition(":")[2])
    try:
        mine = {address for address, p in _listeners() if p == port}
        assert mine == {"127.0.0.1"}, mine
        store.set("k", "v")
        assert store.get("k") == b"v"
    finally:
        del store
