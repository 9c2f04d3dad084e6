"""``dispatchcore.trace`` writes a Chrome/Perfetto trace with a driver track and one track per rank."""

from __future__ import annotations

import json
from pathlib import Path

from dispatchcore import WorkerGroup, trace
from dispatchcore.testing.conformance import batch
from dispatchcore.testing.workers import EchoWorker


def test_trace_file_has_driver_and_rank_tracks(tmp_path: Path) -> None:
    path = tmp_path / "run.trace.json"
    with WorkerGroup(EchoWorker, 3) as wg:
        with trace(path) as tracer:
            out = wg.echo(batch(6))
            wg.only_rank_zero()
        assert len(out) == 6 and "rank" in out.batch.keys()  # results unwrapped as usual
        assert wg.info()[0]["rank"] == 0  # tracing off again
    events = json.loads(path.read_text())["traceEvents"]
    tracks = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert tracks[0] == "driver"
    rank_tracks = sorted(v for v in tracks.values() if v != "driver")
    prefix = rank_tracks[0].rsplit(" rank ", 1)[0]
    assert prefix.startswith("EchoWorker#")
    assert rank_tracks == [f"{prefix} rank {r}" for r in range(3)]
    slices = [e for e in events if e["ph"] == "X"]
    driver = [e["name"] for e in slices if e["tid"] == 0]
    assert driver[:3] == ["echo dispatch", "echo execute", "echo collect"]
    echo_ranks = sorted(e["tid"] for e in slices if e["name"] == "echo")
    assert len(echo_ranks) == 3 and 0 not in echo_ranks
    assert [e["name"] for e in slices if e["tid"] not in (0,) and e["name"] == "only_rank_zero"] == ["only_rank_zero"]
    assert all(e["dur"] >= 0 and e["ts"] > 0 for e in slices)
    assert set(tracer.phase_totals()) == {"dispatch", "execute", "compute", "collect"}
