"""The lane's handshake, played by strangers: a fake rank, a fake driver, a relay, a crowd of idle sockets.

Each stranger runs in this process but speaks only bytes over loopback, as a
process of another user would; none of them learns the secret.
"""

from __future__ import annotations

import contextlib
import secrets
import socket
import threading
import time

import pytest

from dispatchcore import DispatchRuntimeError, DispatchValueError
from dispatchcore.executor import (
    HANDSHAKE_TIMEOUT_S,
    LaneAddress,
    LaneAuthError,
    LaneLink,
    accept_link,
    connect_lane,
    lane_secret,
    offer_link,
    open_lane,
    use_lane_secret,
)

pytestmark = pytest.mark.timeout(60)


def _accepting(door, ranks, timeout=20.0):  # type: ignore[no-untyped-def]
    links: dict[int, LaneLink] = {}
    errors: list[BaseException] = []

    def run() -> None:
        try:
            links.update(door.accept(ranks, timeout))
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    return links, errors, thread


def test_a_rank_with_another_secret_is_refused_and_the_real_one_still_gets_in() -> None:
    with open_lane("127.0.0.1", secrets.token_bytes(32)) as door:
        links, errors, thread = _accepting(door, [0])
        with pytest.raises(LaneAuthError):
            connect_lane(door.address, 0, timeout=10, secret=secrets.token_bytes(32))
        real = connect_lane(door.address, 0, timeout=10, secret=door._secret)  # noqa: SLF001 - the driver's own
        thread.join(20)
    assert not errors and sorted(links) == [0]
    assert door.strangers == 1
    links[0].send(b"hello")
    assert real.recv() == b"hello"
    real.close()
    links[0].close()


def test_a_fake_driver_is_found_out_before_the_rank_reads_a_byte_of_its_messages() -> None:
    """A listener that greets like a door but cannot answer the rank's challenge."""
    server = socket.create_server(("127.0.0.1", 0))
    sent_after: list[bytes] = []

    def fake_driver() -> None:
        sock, _ = server.accept()
        with sock:
            sock.sendall(b"dispatchcore-lane/1" + secrets.token_bytes(32))
            sock.recv(8 + 32 + 32)
            sock.sendall(secrets.token_bytes(32))  # a guess at the proof
            payload = b"cos\nsystem\n(S'touch /tmp/never'\ntR."  # a pickle that would run a command
            sock.sendall(payload)
            sent_after.append(payload)

    thread = threading.Thread(target=fake_driver)
    thread.start()
    address = LaneAddress("127.0.0.1", server.getsockname()[1])
    with pytest.raises(LaneAuthError, match="fake driver"):
        connect_lane(address, 0, timeout=10, secret=secrets.token_bytes(32))
    thread.join(10)
    server.close()
    assert sent_after  # the fake driver did send its pickle: the rank refused the link before reading it


def test_a_relay_between_a_rank_and_the_door_gets_neither_side_to_accept() -> None:
    """A stranger forwarding bytes both ways (it need not know the secret) is caught by the connection's ends."""
    secret = secrets.token_bytes(32)
    with open_lane("127.0.0.1", secret) as door:
        relay = socket.create_server(("127.0.0.1", 0))

        def forward(src: socket.socket, dst: socket.socket) -> None:
            try:
                while data := src.recv(4096):
                    dst.sendall(data)
            except OSError:
                pass
            finally:
                for s in (src, dst):
                    with contextlib.suppress(OSError):  # wakes the other direction's recv (a close alone would not)
                        s.shutdown(socket.SHUT_RDWR)
                    s.close()

        def run_relay() -> None:
            rank_side, _ = relay.accept()
            door_side = socket.create_connection(("127.0.0.1", door.address.port))
            threading.Thread(target=forward, args=(rank_side, door_side), daemon=True).start()
            threading.Thread(target=forward, args=(door_side, rank_side), daemon=True).start()

        threading.Thread(target=run_relay, daemon=True).start()
        links, errors, thread = _accepting(door, [0], timeout=2.0)
        with pytest.raises(LaneAuthError):
            connect_lane(LaneAddress("127.0.0.1", relay.getsockname()[1]), 0, timeout=10, secret=secret)
        thread.join(20)
        relay.close()
    assert not links and errors and "did not connect" in str(errors[0])
    assert door.strangers == 1


def test_idle_strangers_do_not_delay_the_ranks() -> None:
    """Thirty sockets that never answer: each costs its own thread, the ranks are let in beside them."""
    secret = secrets.token_bytes(32)
    with open_lane("127.0.0.1", secret) as door:
        idle = [socket.create_connection(("127.0.0.1", door.address.port)) for _ in range(30)]
        links, errors, thread = _accepting(door, [0, 1], timeout=30 * HANDSHAKE_TIMEOUT_S / 3)
        ranks = [connect_lane(door.address, r, timeout=10, secret=secret) for r in (0, 1)]
        thread.join(30)
        assert not errors and sorted(links) == [0, 1]  # in one sequence the thirty would take 60 s
        deadline = time.monotonic() + 20
        while door.strangers < 30 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert door.strangers == 30
    for sock in idle:
        sock.close()
    for link in (*links.values(), *ranks):
        link.close()


def test_the_handshake_halves_work_on_any_socket_pair() -> None:
    secret = secrets.token_bytes(32)
    with socket.create_server(("127.0.0.1", 0)) as server:
        right = socket.create_connection(server.getsockname()[:2])
        left, _ = server.accept()
    got: list[int] = []
    thread = threading.Thread(target=lambda: got.append(accept_link(left, secret)))
    thread.start()
    offer_link(right, secret, 7)
    thread.join(10)
    assert got == [7]
    left.close()
    right.close()


def test_a_process_keeps_one_secret_and_refuses_weak_ones() -> None:
    current = lane_secret()
    assert len(current) == 32 and lane_secret() == current
    use_lane_secret(current)  # the same one again: fine
    with pytest.raises(DispatchRuntimeError, match="before the first"):
        use_lane_secret(secrets.token_bytes(32))
    with pytest.raises(DispatchValueError, match="at least 16 bytes"):
        open_lane("127.0.0.1", b"short")
    assert LaneAddress.decode("127.0.0.1 5000") == LaneAddress("127.0.0.1", 5000)
    with pytest.raises(DispatchValueError, match="host port"):
        LaneAddress.decode("127.0.0.1 5000 " + secrets.token_hex(16))
