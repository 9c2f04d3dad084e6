"""Self-started torchrun groups against a stranger on this machine (issue 39): nothing it sends runs anywhere.

Every attack comes from a separate process on loopback (``_stranger.py``), as another local user:
pickles pushed onto every store key the library once read, a rank without the secret at the driver's
hub, a stranger at the lane door while the group grows.  After each the group still serves calls and
lazy rows (fetched rank to rank and by the driver), and no marker file exists.  No listener of the
driver or its ranks is beyond loopback, and a child outlives a killed driver by moments.
"""

from __future__ import annotations

import ipaddress
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from _stranger import listening
from dispatchcore import DataProto, Dispatch, Worker, WorkerGroup, available_backends, register

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(180),
    pytest.mark.skipif(not Path("/proc/self/net/tcp").exists(), reason="needs Linux /proc"),
]

STRANGER = str(Path(__file__).with_name("_stranger.py"))
#: How long a child may outlive its killed driver (the watch on its pipe starts before torch is imported).
DRIVER_GONE_BOUND_S = 3.0


class Keeper(Worker):
    @register(Dispatch.DP_COMPUTE_PROTO)
    def double(self, data: DataProto) -> DataProto:
        return DataProto.from_dict({"x": data.batch["x"] * 2})

    @register(Dispatch.ONE_TO_ALL)
    def pid(self) -> int:
        return os.getpid()


def stranger(*args: str) -> list[str]:
    """Run the stranger in a process of its own; its output lines."""
    out = subprocess.run(
        [sys.executable, STRANGER, *args], capture_output=True, text=True, timeout=120, check=True, env=_plain_env()
    )
    return out.stdout.split("\n")[:-1]


def _plain_env() -> dict[str, str]:
    """No secret of ours: only what any user of the machine has."""
    return {k: v for k, v in os.environ.items() if not k.startswith("DISPATCHCORE")}


def assert_serves(wg: WorkerGroup[Keeper]) -> None:
    """Calls, rows fetched rank to rank (each rank reads the other's) and a driver read all still work."""
    data = DataProto.from_dict({"x": torch.arange(12)})
    lazy = wg.double.options(lazy=True)(data)
    order = list(range(wg.world_size))[::-1]
    assert torch.equal(wg.ranks(order).double(lazy).batch["x"], data.batch["x"] * 4)
    assert torch.equal(lazy.batch["x"], data.batch["x"] * 2)


def is_loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


#: What the test process listened on before this module's group: not the library's.
_BEFORE: set[tuple[str, int]] = set()


@pytest.fixture(scope="module")
def group() -> Iterator[WorkerGroup[Keeper]]:
    if "torchrun" not in available_backends():
        pytest.skip("torchrun backend unavailable")
    _BEFORE.update(listening(os.getpid()))  # e.g. an earlier test's Ray: its servers are Ray's, not ours
    wg = WorkerGroup(Keeper, 2, backend="torchrun")
    try:
        assert_serves(wg)
        yield wg
    finally:
        wg.shutdown()


def test_pickles_pushed_onto_the_store_run_nowhere(group: WorkerGroup[Keeper], tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    store = group.executor.row_address(0)[2]  # the world's store: a loopback port any local user can reach
    prefixes, pushed = map(int, stranger("pickles", store.host, str(store.port), str(marker))[0].split())
    assert prefixes >= 1 and pushed > 0  # it found the world's prefix
    for _ in range(3):
        assert_serves(group)
    time.sleep(0.5)  # a data thread that popped one would have run it by now
    assert not marker.exists(), "a process ran a pickle a stranger pushed onto the store"


def test_a_rank_without_the_secret_is_refused_and_the_group_serves(group: WorkerGroup[Keeper]) -> None:
    ports = [str(port) for _, port in listening(os.getpid())]
    verdicts = dict(line.split() for line in stranger("knock", *ports))
    assert "admitted" not in verdicts.values(), verdicts
    assert "refused" in verdicts.values(), f"the driver's hub should greet and refuse: {verdicts}"
    assert_serves(group)


def test_a_stranger_at_every_new_port_during_grow(group: WorkerGroup[Keeper]) -> None:
    """Idle at the hub, and knocking on each port that opens while the group grows (its door): the grow succeeds.

    Whether the stranger meets the door (open for moments) depends on timing; any lane it meets refuses it.
    """
    watcher = subprocess.Popen(
        [sys.executable, STRANGER, "watch", str(os.getpid()), "120"],
        stdout=subprocess.PIPE,
        text=True,
        env=_plain_env(),
    )
    try:
        assert watcher.stdout is not None
        lines = []
        while (line := watcher.stdout.readline()) not in ("watching\n", ""):
            lines.append(line)
        assert any(line.split()[1] == "refused" for line in lines), f"the hub should refuse the stranger: {lines}"
        group.grow(1)
        assert group.world_size == 3
        assert_serves(group)
    finally:
        watcher.send_signal(signal.SIGTERM)
        seen, _ = watcher.communicate(timeout=30)
        if group.world_size == 3:
            group.shrink(2)
    assert "admitted" not in "".join(lines) + seen, seen
    assert_serves(group)


def test_no_listener_of_the_driver_or_its_ranks_is_beyond_loopback(group: WorkerGroup[Keeper]) -> None:
    assert_serves(group)
    pids = [os.getpid(), *group.pid()]
    sockets = {pid: listening(pid) for pid in pids}
    assert all(sockets.values()), sockets
    exposed = {pid: [s for s in found if not is_loopback(s[0]) and s not in _BEFORE] for pid, found in sockets.items()}
    assert not any(exposed.values()), f"listening beyond loopback: {exposed}"


DRIVER = """
from dispatchcore import WorkerGroup
from dispatchcore.testing.workers import EchoWorker
WorkerGroup(EchoWorker, 2, backend="torchrun")
"""


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            command = (entry / "cmdline").read_bytes()
        except (OSError, NotADirectoryError):
            continue
        if int(fields[1]) == pid and b"executors_torchrun" in command:
            found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def test_children_outlive_a_killed_driver_by_moments() -> None:
    """Killed while its ranks import torch (seconds on a busy machine): they leave at once, not when it is done."""
    driver = subprocess.Popen([sys.executable, "-c", DRIVER])
    children: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while not (children := _children(driver.pid)):
            assert driver.poll() is None and time.monotonic() < deadline, "the driver never started its ranks"
            time.sleep(0.005)
        time.sleep(0.5)
        children = _children(driver.pid)
        driver.kill()
        killed = time.monotonic()
        while any(_alive(pid) for pid in children):
            waited = time.monotonic() - killed
            assert waited < DRIVER_GONE_BOUND_S, f"ranks {children} outlived their killed driver by {waited:.1f} s"
            time.sleep(0.01)
    finally:
        driver.kill()
        driver.wait()
        for pid in children:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
