"""Ctrl-C in the driver during a call: ``KeyboardInterrupt`` at once, and the group stays usable.

What is documented (docs/errors.md; docs/calls-that-cannot-hang.md): the
interrupted call is cancelled on the ranks (a sleeping rank leaves it when its
sleep returns), and the next call runs once they left it, on the same workers.
A terminal's Ctrl-C reaches every process of the
foreground group, so ranks that share it (self-started torchrun ranks,
the multiprocess example's) get SIGINT too, busy or idle, and must not die
of it.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import torch

from dispatchcore import DataProto

from ._harness import FAULT_TABLE, backend_params, ctrl_c_after, fault_row, full_only
from ._leaks import Snapshot, settle

pytestmark = [pytest.mark.timeout(120), pytest.mark.parametrize("backend", backend_params(), indirect=True)]

#: Backends whose ranks are children in the driver's process group (a terminal's Ctrl-C reaches them).
SAME_PROCESS_GROUP = ("torchrun", "multiprocess")
CALL_S = 2.0  # the interrupted call's length on the ranks
CTRL_C_AFTER = 0.5


@pytest.mark.parametrize(
    "busy",
    [pytest.param([0], id="rank-1-idle"), pytest.param([0, 1], id="all-ranks-busy", marks=full_only)],
)
def test_ctrl_c_interrupts_a_call_and_the_group_stays_usable(
    shared_group: Any, backend: str, busy: list[int], record: Any
) -> None:
    wg = shared_group
    pids = wg.pid()
    ranks = tuple(pids) if backend in SAME_PROCESS_GROUP else ()
    before = Snapshot.take(ray=backend == "ray")
    with ctrl_c_after(CTRL_C_AFTER, also=ranks) as sent, pytest.raises(KeyboardInterrupt):
        wg.sleep_on(busy, CALL_S)
    propagated = time.monotonic() - sent[0]

    # The next calls run after the interrupted one, on the same workers, with their own results.
    assert wg.tagged(["a", "b"]) == [(0, "a"), (1, "b")]
    out = wg.plus_rank(DataProto.from_dict({"x": torch.arange(4)}))
    assert out.batch["x"].tolist() == [0, 1, 1002, 1003]
    assert wg.pid() == pids, "a rank was restarted or replaced"
    leaks = settle(before, ray=backend == "ray")
    where = "ranks got SIGINT too" if ranks else "driver only"
    record(
        FAULT_TABLE.format(backend=backend),
        **fault_row(
            f"Ctrl-C in the driver mid-call ({'every rank busy' if len(busy) == 2 else 'rank 1 idle'}; {where})",
            KeyboardInterrupt(),
            propagated,
            1.0,
            "yes (same workers; the call was cancelled on the ranks, the next call runs once they left it)",
            leaks,
        ),
    )
    assert not leaks
