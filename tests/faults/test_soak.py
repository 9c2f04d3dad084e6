"""The soak in its short form: mixed calls leave threads, fds, processes and Ray's store where they were.

``scripts/soak.py`` is the soak (its module docstring says what runs and
what is sampled); this test loads it and runs a few hundred calls per
backend (``DISPATCHCORE_SOAK_CALLS``, default 300).  Counts are exact after
settling, so they are asserted; RSS growth over so few calls is allocator
noise, so it is only recorded (the full run, ``python scripts/soak.py
--backend B --calls 10000``, checks the 5% criterion).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import socket
import sys
from datetime import timedelta
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from dispatchcore import available_backends

from ._leaks import Snapshot, settle

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "soak.py"
CALLS = int(os.environ.get("DISPATCHCORE_SOAK_CALLS", "300"))
PROCESS_BACKENDS = ("ray", "torchrun", "multiprocess")

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="samples /proc")


def _load_soak() -> ModuleType:
    """``scripts/soak.py`` as the module ``dispatchcore_soak`` (it ships itself to the ranks by value)."""
    name = "dispatchcore_soak"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _open_a_store() -> None:
    """Open and drop a TCPStore made as a self-started torchrun world makes its own.

    A listening socket bound to loopback, handed to the store as ``master_listen_fd`` (the store owns
    it from then on).
    """
    import torch.distributed as dist

    from dispatchcore.executor import LOOPBACK

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind((LOOPBACK, 0))
        sock.listen(socket.SOMAXCONN)
        port = int(sock.getsockname()[1])
        store = dist.TCPStore(
            LOOPBACK, port, None, True, timedelta(seconds=300), wait_for_workers=False, master_listen_fd=sock.fileno()
        )
    except BaseException:
        with contextlib.suppress(OSError):  # a store that failed may have closed it already
            sock.close()
        raise
    sock.detach()
    del store


def _backend(name: str) -> Any:
    marks = [] if name == "local" else [pytest.mark.slow, pytest.mark.timeout(180)]
    return pytest.param(name, marks=marks, id=name)


@pytest.mark.parametrize("backend", [_backend(b) for b in ("local", *PROCESS_BACKENDS)])
def test_short_soak_leaves_nothing_behind(backend: str, request: pytest.FixtureRequest, record: Any) -> None:
    if backend not in available_backends():
        pytest.skip(f"backend {backend!r} is not installed")
    on_ray = backend == "ray"
    if on_ray:
        request.getfixturevalue("ray_session")
    soak = _load_soak()
    # Process-wide resources a backend opens on first use and keeps (not a
    # group's): opened before the baseline so only what a group leaves counts.
    if on_ray:  # the first actors a driver owns: Ray keeps 3 connections for the session
        soak.make_group(backend, 1).shutdown()
    if backend == "torchrun":  # torch's TCPStore keeps a pipe from its first use on
        _open_a_store()  # dropped at once: its socket closes, the pipe stays
    if backend == "multiprocess":  # multiprocessing's resource tracker, started with the first spawned process
        from multiprocessing import resource_tracker

        resource_tracker.ensure_running()
    before = Snapshot.take(ray=on_ray)
    wg = soak.make_group(backend)
    try:
        result = soak.soak(wg, CALLS, samples=10)
    finally:
        wg.shutdown()
    leaks = settle(before, ray=on_ray)
    row = {"form": f"short ({CALLS} calls)", **result.figures(), "leaks after shutdown": leaks or "none"}
    record(f"soak/{backend}", **row)
    assert result.failures(check_rss=False) == []
    assert leaks == {}
