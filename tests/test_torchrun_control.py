"""Unit test of an internal part (torchrun's directory for the lane): imports executors_torchrun._protocol.

Ranks find the lane through the world's store; a death behind a forked child.  The lane itself is
tested once, in ``test_lane.py``.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from datetime import timedelta

import pytest
import torch.distributed as dist

from dispatchcore import Dispatch, Worker, WorkerDiedError, WorkerGroup, register
from dispatchcore.executor import LaneAddress, LaneLink, connect_lane, open_lane
from executors_torchrun._protocol import StoreDirectory

CONTROL_KEY = "lane/g"

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def store() -> dist.TCPStore:
    return dist.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=30), wait_for_workers=False)


def client(store: dist.TCPStore) -> dist.Store:
    """The ranks' own connection to the store (a client serves one blocking wait at a time)."""
    return dist.TCPStore("127.0.0.1", store.port, None, False, timedelta(seconds=30))


def accept_ranks(store: dist.Store, ranks: list[int]) -> dict[int, LaneLink]:
    """The driver: publish a door in the store (an address), take one link from each of ``ranks``."""
    with open_lane("127.0.0.1") as door:
        StoreDirectory(store, CONTROL_KEY).publish(door.address)
        return door.accept(ranks, 30.0, lambda rank: None)


def connect_to_hub(store: dist.Store, rank: int) -> LaneLink:
    """A rank: read the lane's address from the store and connect, proving this process's lane secret."""
    return connect_lane(StoreDirectory(store, CONTROL_KEY).lookup(), rank, 30.0)


def test_only_the_worlds_ranks_get_a_link_and_messages_keep_their_order(store: dist.TCPStore) -> None:
    links: dict[int, LaneLink] = {}
    accepting = threading.Thread(target=lambda: links.update(accept_ranks(store, [1, 2])))
    accepting.start()
    theirs = client(store)
    address = LaneAddress.decode(theirs.get(CONTROL_KEY))
    host, port = address.host, address.port
    stranger = socket.create_connection((host, int(port)))
    stranger.sendall((1).to_bytes(8, "little") + b"\0" * 64)  # claims rank 1 without the secret
    ranks = {rank: connect_to_hub(theirs, rank) for rank in (1, 2)}
    accepting.join(30)
    assert sorted(links) == [1, 2]
    stranger.settimeout(30)
    while stranger.recv(4096):  # the door's challenge, then nothing: it dropped the stranger
        pass
    stranger.close()
    for n in range(50):
        links[1].send(f"to 1: {n}".encode())
        ranks[2].send(f"from 2: {n}".encode())
    assert [ranks[1].recv() for _ in range(50)] == [f"to 1: {n}".encode() for n in range(50)]
    assert [links[2].recv() for _ in range(50)] == [f"from 2: {n}".encode() for n in range(50)]
    ranks[1].close()
    with pytest.raises(ConnectionError):
        links[1].recv()
    for link in (*links.values(), ranks[2]):
        link.close()


class Forker(Worker):
    @register(Dispatch.ONE_TO_ALL)
    def fork_and_die(self) -> None:
        """Leave a child holding every inherited descriptor, then exit: the link outlives the rank."""
        if self.rank == 1:
            if os.fork() == 0:
                time.sleep(30)
                os._exit(0)
            time.sleep(0.2)
            os._exit(3)

    @register(Dispatch.ONE_TO_ALL)
    def ping(self) -> int:
        return self.rank


@pytest.mark.slow
@pytest.mark.timeout(60)  # unreported, the call would wait for its death_timeout (600 s)
def test_a_rank_whose_link_outlives_it_is_still_reported_dead() -> None:
    with WorkerGroup(Forker, 2, backend="torchrun", death_timeout=600) as group:
        assert group.ping() == [0, 1]
        with pytest.raises(WorkerDiedError, match="exited with code 3") as info:
            group.fork_and_die()
        assert info.value.rank == 1
