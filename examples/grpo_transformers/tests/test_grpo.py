"""The example learns, and after every sync the rollout holds exactly the trainer's gathered full parameters.

On self-started torchrun unmarked (10-14 s on 2 cores, most of it start-up),
on Ray and under the torchrun launcher marked slow; ``local`` is refused by name.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from train import GRPOConfig, StepResult, main, train

from dispatchcore import WorkerError


def _check(history: list[StepResult], trace_file: Path, config: GRPOConfig) -> None:
    steps = config.steps
    assert [r.step for r in history] == list(range(1, steps + 1))
    assert all(r.weights_exact for r in history)
    assert {r.rows for r in history} == {config.prompts * config.samples}  # 8 + 7 real rows: padding left out
    start = sum(r.reward for r in history[:3]) / 3
    end = sum(r.reward for r in history[-3:]) / 3
    assert start < 0.2 < 0.7 < end, [round(r.reward, 3) for r in history]
    names = [event.get("name", "") for event in json.loads(trace_file.read_text())["traceEvents"]]
    for phase in ("verify", "pack bucket", "move bucket", "apply bucket"):
        assert sum(f"WeightSync {phase}" in name for name in names) >= steps, phase


def test_the_batch_is_padded_for_the_trainer_group() -> None:
    config = GRPOConfig()
    assert config.prompts * config.samples % config.trainer_ranks != 0


def test_grpo_learns_on_torchrun_with_exact_weights_after_every_sync(tmp_path: Path) -> None:
    """With a raise planted inside backward on trainer rank 1 at step 3: recovered, retried, learning on."""
    config = GRPOConfig(backend="torchrun", check_weights=True, fault_step=3)
    history = train(config, trace_path=str(tmp_path / "trace.json"))
    _check(history, tmp_path / "trace.json", config)
    assert [r.step for r in history if r.retried] == [3]


def test_grpo_learns_asynchronously_on_torchrun_with_staleness_at_most_one(tmp_path: Path) -> None:
    """``--async-staleness 1``: the rollout generates while the trainer trains; no batch is over 1 version old."""
    config = GRPOConfig(backend="torchrun", async_staleness=1)
    history = train(config, trace_path=str(tmp_path / "trace.json"))
    assert [r.step for r in history] == list(range(1, config.steps + 1))
    assert {r.rows for r in history} == {config.prompts * config.samples}
    assert {r.staleness for r in history} <= {0, 1}
    start = sum(r.reward for r in history[:3]) / 3
    end = sum(r.reward for r in history[-3:]) / 3
    assert start < 0.2 < 0.7 < end, [round(r.reward, 3) for r in history]
    names = [event.get("name", "") for event in json.loads((tmp_path / "trace.json").read_text())["traceEvents"]]
    assert sum(name.startswith("batch ") for name in names) >= config.steps  # each batch's version on its track


@pytest.mark.slow
def test_a_step_recovered_after_a_raise_inside_backward_ends_as_a_clean_run() -> None:
    clean = train(GRPOConfig(backend="torchrun", steps=3))
    faulted = train(GRPOConfig(backend="torchrun", steps=3, fault_step=2))
    assert [r.retried for r in faulted] == [False, True, False]
    assert [(r.reward, r.loss, r.kl) for r in faulted] == [(r.reward, r.loss, r.kl) for r in clean]


@pytest.mark.slow
def test_grpo_learns_on_ray_with_exact_weights_after_every_sync(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    request.getfixturevalue("ray_session")
    config = GRPOConfig(backend="ray", check_weights=True)
    _check(train(config, trace_path=str(tmp_path / "trace.json")), tmp_path / "trace.json", config)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("torchrun") is None, reason="torchrun is not on PATH")
def test_the_script_under_the_torchrun_launcher_places_the_groups_on_its_ranks() -> None:
    """``torchrun --nproc-per-node=3 train.py --async-staleness 1``: trainer on world ranks 0-1 (``ranks=[...]``),
    rollout on rank 2, a stream whose batches are at most 1 version old.  The synchronous loop with the weights
    checked after every sync runs self-started above (and a launch's weight bridge in test_torchrun_bridge.py)."""
    script = Path(__file__).parents[1] / "train.py"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHELASTIC", "RANK", "MASTER_"))}
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    command = [shutil.which("torchrun") or "torchrun", "--standalone", "--nproc-per-node=3", str(script)]
    command += ["--backend", "torchrun", "--async-staleness", "1"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=240, env=env, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    steps = re.findall(r"^step +\d+ +reward ([\d.]+) .* staleness ([01])$", result.stdout, re.M)
    assert len(steps) == GRPOConfig.steps, result.stdout
    assert float(steps[0][0]) < 0.2 < 0.7 < float(steps[-1][0]), result.stdout


def test_local_is_refused_naming_the_way(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--backend", "local"])
    assert "--backend torchrun" in capsys.readouterr().err
    with pytest.raises(WorkerError, match=r"threads of one process.*backend='torchrun'"):
        train(GRPOConfig(backend="local", steps=1))
