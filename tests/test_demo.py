"""The demo learns on the local backend, and its trace has per-rank tracks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dispatchcore.demo import DemoConfig, run_demo
from dispatchcore.demo.loop import group_baseline_advantages


def test_reward_rises_on_local() -> None:
    history = run_demo(DemoConfig(backend="local", world_size=2, steps=25))
    first = sum(m.reward for m in history[:3]) / 3
    last = sum(m.reward for m in history[-3:]) / 3
    assert first < 0.3 and last > first + 0.3, (first, last)
    assert all(m.dispatch_s >= 0 and m.compute_s > 0 and m.collect_s >= 0 for m in history)


def test_same_numbers_for_any_world_size_split_of_the_update() -> None:
    """Padding rows are masked: 3 ranks (uneven split) still train on exactly the batch."""
    history = run_demo(DemoConfig(backend="local", world_size=3, steps=3))
    assert len(history) == 3 and all(m.reward > 0 for m in history)


def test_group_baseline_advantages() -> None:
    import torch

    adv = group_baseline_advantages(torch.tensor([1.0, 0.0, 0.5, 0.5]), samples=2)
    assert adv.tolist() == [0.5, -0.5, 0.0, 0.0]


def test_cli_writes_a_trace_with_rank_tracks(tmp_path: Path) -> None:
    path = tmp_path / "demo.json"
    out = subprocess.run(
        [sys.executable, "-m", "dispatchcore._cli", "demo", "--steps", "2", "--trace", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    assert "reward" in out and "trace written" in out
    events = json.loads(path.read_text())["traceEvents"]
    names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert "driver" in names
    assert sum(" rank " in n for n in names) == 4  # two groups (actor+ref colocated, reward) x 2 ranks
    methods = {e["name"] for e in events if e["ph"] == "X"}
    assert {"actor.generate_sequences", "compute_reward", "ref.compute_ref_log_prob", "actor.update_actor"} <= methods


@pytest.mark.parametrize("argv", [["--help"]])
def test_module_entry_point(argv: list[str]) -> None:
    done = subprocess.run([sys.executable, "-m", "dispatchcore.demo", *argv], capture_output=True, text=True)
    assert done.returncode == 0 and "--backend" in done.stdout


def test_checkpoint_is_written_by_rank_zero(tmp_path: Path) -> None:
    import torch

    path = tmp_path / "ckpt" / "policy.pt"
    run_demo(DemoConfig(backend="local", world_size=2, steps=1, checkpoint=str(path)))
    state = torch.load(path, weights_only=False)
    assert "policy" in state and state["config"]["seed"] == 0


def test_bench_command_prints_the_local_ratio_table() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "dispatchcore._cli", "bench", "--quick", "--only", "local"],
        capture_output=True,
        text=True,
        timeout=240,
        check=True,
    ).stdout
    assert "local executor vs floor" in out and "| 4 | DP echo 1MB |" in out
    assert "Core per-call cost, null executor" in out and "| 64 |" in out  # the core's own budget comes first
