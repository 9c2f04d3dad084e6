"""Under the torchrun launcher a driver that can have no shared lane secret refuses to start, naming the fix.

torchrun's variables are set in this process (no launch runs): the refusal comes before any store,
door or process, and before this process's own lane secret could change.  The launches that do get
a secret run in ``test_torchrun_trust_launch.py`` and ``test_torchrun_multinode.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dispatchcore import DispatchRuntimeError, WorkerGroup, available_backends
from dispatchcore.testing.workers import EchoWorker

pytestmark = pytest.mark.skipif("torchrun" not in available_backends(), reason="torchrun backend unavailable")


@pytest.fixture
def launched(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> pytest.MonkeyPatch:
    """This process looks like rank 0 of a one-node launch of 2 (its secret directory under ``tmp_path``)."""
    for name, value in {
        "TORCHELASTIC_RUN_ID": "trust-test",
        "RANK": "0",
        "WORLD_SIZE": "2",
        "LOCAL_WORLD_SIZE": "2",
        "GROUP_WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "1",
        "XDG_RUNTIME_DIR": str(tmp_path),
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("DISPATCHCORE_SECRET", raising=False)
    return monkeypatch


def test_a_multi_node_launch_without_the_variable_is_refused(launched: pytest.MonkeyPatch) -> None:
    launched.setenv("WORLD_SIZE", "4")  # two of four processes on this node
    with pytest.raises(DispatchRuntimeError, match=r"spans several nodes.*DISPATCHCORE_SECRET.*token_hex"):
        WorkerGroup(EchoWorker, 2, backend="torchrun")


@pytest.mark.parametrize("value", ["not hex", "abcd"], ids=["not-hex", "too-short"])
def test_a_bad_variable_is_refused(launched: pytest.MonkeyPatch, value: str) -> None:
    launched.setenv("DISPATCHCORE_SECRET", value)
    with pytest.raises(DispatchRuntimeError, match="DISPATCHCORE_SECRET must be a random hex string"):
        WorkerGroup(EchoWorker, 2, backend="torchrun")


def test_a_secret_directory_others_can_read_is_refused(launched: pytest.MonkeyPatch, tmp_path: Path) -> None:
    folder = tmp_path / "dispatchcore"
    folder.mkdir(mode=0o755)
    folder.chmod(0o755)
    with pytest.raises(DispatchRuntimeError, match=r"mode 755.*chmod 700"):
        WorkerGroup(EchoWorker, 2, backend="torchrun")
    assert list(folder.iterdir()) == [], "nothing is written where others can read"
