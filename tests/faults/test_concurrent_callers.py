"""Several driver threads call one group at once: every result stays with its caller.

Each thread sends calls whose answers name the caller (``tagged``) and data
whose rows identify it (``plus_rank``); one thread's planted raise reaches
that thread only.  Every backend, on the run's shared group.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import torch

from dispatchcore import DataProto, WorkerError

from ._harness import FAULT_TABLE, backend_params, fault_row
from ._leaks import Snapshot, settle

pytestmark = [pytest.mark.timeout(120), pytest.mark.parametrize("backend", backend_params(), indirect=True)]

THREADS = 6
CALLS = 15


def _caller(wg: Any, index: int, errors: list[BaseException], raised: list[WorkerError]) -> None:
    try:
        for call in range(CALLS):
            token = (index, call)
            assert wg.tagged([token, token]) == [(0, token), (1, token)]
            base = index * 100 + call
            out = wg.plus_rank(DataProto.from_dict({"x": torch.arange(base, base + 4)}))
            assert out.batch["x"].tolist() == [base, base + 1, base + 1002, base + 1003]
            if index == 0 and call == CALLS // 2:
                try:
                    wg.raise_on(1)
                except WorkerError as exc:
                    raised.append(exc)
    except BaseException as exc:  # noqa: BLE001 - reported on the main thread
        errors.append(exc)


def test_concurrent_callers_get_their_own_results(shared_group: Any, backend: str, record: Any) -> None:
    wg = shared_group
    before = Snapshot.take(ray=backend == "ray")
    errors: list[BaseException] = []
    raised: list[WorkerError] = []
    threads = [
        threading.Thread(target=_caller, args=(wg, i, errors, raised), name=f"caller-{i}") for i in range(THREADS)
    ]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seconds = time.monotonic() - started
    assert not errors, errors[0]
    assert len(raised) == 1 and (raised[0].rank, raised[0].method) == (1, "raise_on")
    assert wg.ping() == [0, 1]
    leaks = settle(before, ray=backend == "ray")
    record(
        FAULT_TABLE.format(backend=backend),
        **fault_row(
            f"{THREADS} driver threads call at once ({THREADS * CALLS * 2} calls, one raises)",
            raised[0],
            seconds,
            "-",
            "yes (every result with its caller)",
            leaks,
            **{"time to detect (s)": f"{seconds:.2f} (all calls)"},
        ),
    )
    assert not leaks
