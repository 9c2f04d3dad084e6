"""The control lane, the shared part every process executor may use (``dispatchcore.executor``).

Who may connect, order, sends that never block, a link's end as the peer's
death, and where the door listens.
"""

from __future__ import annotations

import os
import socket
import threading
import time

import pytest

from dispatchcore.executor import LaneAddress, LaneLink, connect_lane, open_lane

pytestmark = pytest.mark.timeout(60)


def _wait_for(condition, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition never held"
        time.sleep(0.01)


def _accept_in_background(door, ranks, timeout=30.0):  # type: ignore[no-untyped-def]
    links: dict[int, LaneLink] = {}
    thread = threading.Thread(target=lambda: links.update(door.accept(ranks, timeout)))
    thread.start()
    return links, thread


def test_only_holders_of_the_secret_get_a_link_and_messages_keep_their_order() -> None:
    with open_lane("127.0.0.1") as door:
        links, accepting = _accept_in_background(door, [1, 2])
        address = LaneAddress.decode(door.address.encode())  # what a directory carries
        stranger = socket.create_connection((address.host, address.port))
        stranger.sendall((1).to_bytes(8, "little") + b"\0" * 64)  # claims rank 1 without the secret
        garbage = socket.create_connection((address.host, address.port))
        garbage.sendall(b"GET / HTTP/1.0\r\nHost: lane\r\n\r\n" + b"x" * 80)  # refused without waiting
        ranks = {rank: connect_lane(address, rank) for rank in (1, 2)}
        accepting.join(30)
    assert sorted(links) == [1, 2]
    _wait_for(lambda: door.strangers == 2)
    for sock in (stranger, garbage):
        assert _dropped(sock)
        sock.close()
    for n in range(50):
        links[1].send(f"to 1: {n}".encode())
        ranks[2].send_parts([b"from 2: ", str(n).encode()])
    assert [ranks[1].recv() for _ in range(50)] == [f"to 1: {n}".encode() for n in range(50)]
    assert [links[2].recv() for _ in range(50)] == [f"from 2: {n}".encode() for n in range(50)]
    ranks[1].close()
    with pytest.raises(ConnectionError):
        links[1].recv()  # a link's end is how the other side learns its peer is gone
    for link in (*links.values(), ranks[2]):
        link.close()


def test_the_door_listens_on_the_one_interface_asked_and_stops_once_closed() -> None:
    door = open_lane("localhost")
    assert door.address.host == "localhost"
    with socket.create_connection(("127.0.0.1", door.address.port)):
        pass  # it listens on loopback
    assert door.address.encode() == f"localhost {door.address.port}"  # an address carries no secret
    door.close()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", door.address.port), timeout=5)
    for everywhere in ("", "0.0.0.0", "::"):  # noqa: S104 - the test is that these are refused
        with pytest.raises(ValueError, match="one interface"):
            open_lane(everywhere)


def test_the_door_is_not_reachable_on_other_interfaces() -> None:
    outside = _non_loopback_address()
    if outside is None:
        pytest.skip("this machine has no address besides loopback")
    with open_lane("127.0.0.1") as door, pytest.raises(OSError):
        socket.create_connection((outside, door.address.port), timeout=2)


@pytest.mark.timeout(30)  # a send that blocked would wait forever for this test to read
def test_sending_to_a_peer_that_is_not_reading_never_blocks() -> None:
    with open_lane("127.0.0.1") as door:
        links, accepting = _accept_in_background(door, [1])
        rank = connect_lane(door.address, 1)
        accepting.join(30)
    big = os.urandom(1 << 20)
    for n in range(64):  # 64 MiB, far past what the socket buffers hold, before anything is read
        links[1].send_parts([n.to_bytes(4, "little"), memoryview(big)])
    for n in range(64):
        message = rank.recv()
        assert message[:4] == n.to_bytes(4, "little") and message[4:] == big
    message[0] ^= 1  # what arrives is the receiver's own memory
    links[1].close()
    rank.close()


@pytest.mark.timeout(30)  # the accept timeout (600 s) would end it with a TimeoutError instead
def test_a_rank_that_dies_before_connecting_fails_the_wait_at_once() -> None:
    with open_lane("127.0.0.1") as door, pytest.raises(RuntimeError, match="rank process 2 never connected"):
        door.accept([1, 2], 600.0, gone=lambda rank: "it crashed" if rank == 2 else None)


def test_connecting_too_late_is_a_timeout_naming_the_ranks() -> None:
    with (
        open_lane("127.0.0.1") as door,
        pytest.raises(TimeoutError, match=r"rank processes \[3\] did not connect to the driver within 0.5 s"),
    ):
        door.accept([3], 0.5)


def _dropped(sock: socket.socket) -> bool:
    """Whether the door closed ``sock`` (after its challenge; a reset when it left bytes unread)."""
    sock.settimeout(10)
    try:
        while sock.recv(4096):
            pass
    except ConnectionResetError:
        pass
    return True


def _non_loopback_address() -> str | None:
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(("10.255.255.255", 1))  # picks the outgoing interface; sends nothing
            address = str(probe.getsockname()[0])
    except OSError:
        return None
    return None if address.startswith("127.") else address
