"""Ray groups on the control lane: calls on one socket per actor, Ray for everything else.

The lane itself (order, tokens, sends that never block) is tested once in
``test_lane.py``; this file tests what the Ray executor builds on it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import ipaddress
import os
import socket
import subprocess
import sys
import threading
import time

import pytest
import torch

ray = pytest.importorskip("ray")

import dispatchcore._lane._driver as ray_lane  # noqa: E402 - the door the core's lane opens, watched (private, on purpose)
from dispatchcore import (  # noqa: E402
    DataProto,
    Dispatch,
    DispatchError,
    DispatchValueError,
    Worker,
    WorkerGroup,
    collective,
    register,
)
from executors_ray._lane_setup import ray_client_error  # noqa: E402
from executors_ray.testing import ray_session  # noqa: E402, F401

pytestmark = [pytest.mark.usefixtures("ray_session"), pytest.mark.timeout(120)]

# The worker class travels by value: Ray's worker processes cannot import this test module.
for _pickler in (pytest.importorskip("cloudpickle"), pytest.importorskip("ray.cloudpickle")):
    _pickler.register_pickle_by_value(sys.modules[__name__])


class Threads(Worker):
    """Records the thread its ``__init__`` ran on."""

    def __init__(self) -> None:
        super().__init__()
        self.init_thread = threading.get_ident()

    @register(Dispatch.ONE_TO_ALL)
    def threads(self) -> tuple[int, int]:
        return self.init_thread, threading.get_ident()

    @register(Dispatch.ONE_TO_ALL)
    def total(self, value: object) -> tuple[str, float]:
        """What arrived, and its sum (a reference is read here, as on the Ray path)."""
        kind = type(value).__name__
        return kind, float((ray.get(value) if kind == "ObjectRef" else value).sum())  # type: ignore[attr-defined]

    @register(Dispatch.ONE_TO_ALL)
    def put_back(self, value: int) -> object:
        return ray.put(value * 2)  # a result only Ray can hand over

    @register(Dispatch.DP_COMPUTE_PROTO)
    def echo(self, data: DataProto) -> DataProto:
        return data

    @register(Dispatch.ONE_TO_ALL)
    def summed(self) -> float:
        t = torch.ones(1) * (self.rank + 1)
        collective.all_reduce(t)  # through the store the driver hosts for the group
        return float(t)


def test_calls_on_the_lane_run_on_the_thread_init_ran_on() -> None:
    with WorkerGroup(Threads, 2, backend="ray") as group:
        assert group.executor.lane is not None  # the calls below come by the lane
        for init_thread, call_thread in group.threads():
            assert call_thread == init_thread  # CUDA's current device is per thread
        x = DataProto.from_dict({"x": torch.arange(12).reshape(6, 2)})
        assert torch.equal(group.echo(x).batch["x"], x.batch["x"])


def test_references_and_large_values_take_ray_beside_the_lane() -> None:
    with WorkerGroup(Threads, 2, backend="ray", lane_inline_bytes=1 << 20) as group:  # 8 MiB by default
        ref = ray.put(torch.ones(3))
        assert group.total(torch.ones(2)) == [("Tensor", 2.0)] * 2
        assert group.total(ref) == [("ObjectRef", 3.0)] * 2  # handed over by Ray, unresolved as on the Ray path
        assert group.total(torch.ones(300_000)) == [("Tensor", 300_000.0)] * 2  # past 1 MiB: the object store
        assert group.put_back(4) == [8, 8]  # a returned reference is read, as on the Ray path
        big = DataProto.from_dict({"x": torch.arange(600_000).reshape(6, -1)})  # results past 1 MiB, too
        assert torch.equal(group.echo(big).batch["x"], big.batch["x"])


@pytest.mark.parametrize("option", [{"lane": False}, {"compiled": True}, {"compiled_idle_s": 5.0}])
def test_the_removed_call_paths_options_say_so_and_start_nothing(option: dict[str, object]) -> None:
    with pytest.raises(DispatchValueError) as info:
        WorkerGroup(Threads, 2, backend="ray", name="removed", **option)
    message = str(info.value)
    assert f"{next(iter(option))}=" in message and "removed" in message
    assert "one socket per actor" in message and "object store" in message  # why
    assert "drop it" in message  # what to do
    assert not [a for a in ray.util.list_named_actors() if a.startswith("removed-")]  # nothing was started


def test_the_removed_options_at_their_old_defaults_change_nothing() -> None:
    with WorkerGroup(Threads, 2, backend="ray", lane=True, compiled=False) as group:
        assert group.executor.lane is not None
        assert len(group.threads()) == 2


@pytest.mark.parametrize("address", ["ray://head:10001", None])
def test_ray_client_is_refused_at_once_with_the_way_out(address: str | None) -> None:
    """Decided before any actor starts: over Ray Client (an address, or a connection already made)."""
    error = ray_client_error(address, connected=address is None)
    assert isinstance(error, DispatchError)
    assert "Ray Client" in str(error) and "run the driver on the cluster" in str(error) and "Ray job" in str(error)
    assert ray_client_error(None, connected=False) is None
    assert ray_client_error("10.0.0.1:6379", connected=False) is None


def test_a_group_over_a_ray_client_connection_fails_before_any_actor_starts(monkeypatch) -> None:
    monkeypatch.setattr(ray.util.client.ray, "is_connected", lambda: True)  # as after ray.init("ray://...")
    with pytest.raises(DispatchError, match="Ray Client") as info:
        WorkerGroup(Threads, 2, backend="ray", name="client")
    assert "Ray job" in str(info.value)
    monkeypatch.undo()
    assert not [a for a in ray.util.list_named_actors() if a.startswith("client-")]


def test_a_ray_client_address_fails_at_once_without_connecting() -> None:
    """No Ray Client server is needed: the ``ray://`` address is refused before Ray is reached."""
    code = (
        "import dispatchcore as d\n"
        "class W(d.Worker): pass\n"
        "try:\n"
        "    d.WorkerGroup(W, 2, backend='ray', address='ray://127.0.0.1:1')\n"
        "except d.DispatchError as e:\n"
        "    import ray; print('refused', ray.is_initialized(), e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.startswith("refused False "), out.stdout + out.stderr
    assert "ray://127.0.0.1:1" in out.stdout and "run the driver on the cluster" in out.stdout


def test_a_stranger_at_the_door_is_dropped_and_the_door_closes_once_the_actors_are_in(monkeypatch) -> None:
    doors, strangers = [], []
    real_open = ray_lane.open_lane

    def open_with_a_stranger(host: str):  # type: ignore[no-untyped-def]
        door = real_open(host)
        doors.append(door)
        stranger = socket.create_connection((door.address.host, door.address.port))
        stranger.sendall((0).to_bytes(8, "little") + b"x" * 64)  # claims rank 0 with a wrong answer
        strangers.append(stranger)
        return door

    monkeypatch.setattr(ray_lane, "open_lane", open_with_a_stranger)
    with WorkerGroup(Threads, 2, backend="ray") as group:
        assert len(group.threads()) == 2
        (door,) = doors
        deadline = time.monotonic() + 10
        while door.strangers < 1 and time.monotonic() < deadline:  # its handshake ran on a thread of its own
            time.sleep(0.02)
        assert door.strangers == 1
        assert door.address.host == "127.0.0.1"  # every actor shares the driver's node: loopback only
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", door.address.port), timeout=5)
        strangers[0].settimeout(10)
        assert strangers[0].recv(4096).startswith(b"dispatchcore-lane/1")  # the challenge it could not answer
        assert strangers[0].recv(4096) == b""  # then dropped
        strangers[0].close()


def test_a_driver_that_cannot_open_the_lane_fails_the_group_and_leaves_no_actor(monkeypatch) -> None:
    monkeypatch.setattr("executors_ray._executor.lane_host", lambda ray, infos: "192.0.2.1")  # not ours: bind fails
    # The first of the driver's listeners on that host to fail names itself (the collectives' store, the lane).
    with pytest.raises(DispatchError, match=r"could not open .*(lane|collectives) on 192\.0\.2\.1") as info:
        WorkerGroup(Threads, 2, backend="ray", name="no-door")
    assert "cannot start" in str(info.value)
    assert not [a for a in ray.util.list_named_actors() if a.startswith("no-door-")]


def test_actors_that_cannot_reach_the_lane_fail_the_group_naming_them(monkeypatch) -> None:
    real = ray_lane.open_lane

    def unreachable(host: str):  # type: ignore[no-untyped-def]
        door = real(host)
        door.address = dataclasses.replace(door.address, port=1)  # the actors are told a port nobody listens on
        return door

    monkeypatch.setattr(ray_lane, "open_lane", unreachable)
    with pytest.raises(DispatchError) as info:
        WorkerGroup(Threads, 2, backend="ray", name="cut-off", start_timeout=20)
    message = str(info.value)
    assert "could not reach the driver's control lane" in message
    assert "cut-off-rank0" in message and "cut-off-rank1" in message  # the actors
    assert "never connected" in message and "ConnectionRefusedError" in message  # why
    assert not [a for a in ray.util.list_named_actors() if a.startswith("cut-off-")]


def _listening() -> set[tuple[str, int]]:
    """``(address, port)`` of every TCP socket this process listens on (from /proc)."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    found = set()
    for table, width in (("/proc/net/tcp", 4), ("/proc/net/tcp6", 16)):
        with contextlib.suppress(OSError), open(table) as lines:
            for line in list(lines)[1:]:
                fields = line.split()
                if fields[3] == "0A" and fields[9] in inodes:  # LISTEN
                    addr, port = fields[1].split(":")
                    raw = bytes.fromhex(addr)
                    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))  # host order per word
                    found.add((str(ipaddress.ip_address(words if width == 16 else raw[::-1])), int(port, 16)))
    return found


@pytest.mark.skipif(not os.path.exists("/proc/self/fd"), reason="reads this process's sockets from /proc")
def test_the_drivers_own_listeners_bind_to_loopback_on_one_node(monkeypatch) -> None:
    doors: list[str] = []
    real = ray_lane.open_lane

    def watched(host: str, *args, **kwargs):  # type: ignore[no-untyped-def]
        doors.append(host)
        return real(host, *args, **kwargs)

    monkeypatch.setattr(ray_lane, "open_lane", watched)
    before = _listening()
    with WorkerGroup(Threads, 2, backend="ray") as group:
        assert group.summed() == [3.0, 3.0]
        opened = _listening() - before  # Ray's own servers were up before: Ray binds those
        assert opened, "the group's collectives store should be listening"
        assert all(ipaddress.ip_address(addr).is_loopback for addr, _ in opened), opened
    assert doors == ["127.0.0.1"]  # the lane's door: every actor shares this node
