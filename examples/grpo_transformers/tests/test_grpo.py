"""The example learns, and after every sync the rollout holds exactly the trainer's gathered full parameters.

On self-started torchrun in the default run (about 12 s here: start-up is
most of it), on Ray marked slow; ``local`` is refused by name.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from train import GRPOConfig, StepResult, main, train

from dispatchcore import WorkerError


def _check(history: list[StepResult], trace_file: Path, steps: int) -> None:
    assert [r.step for r in history] == list(range(1, steps + 1))
    assert all(r.weights_exact for r in history)
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
    config = GRPOConfig(backend="torchrun", check_weights=True)
    _check(train(config, trace_path=str(tmp_path / "trace.json")), tmp_path / "trace.json", config.steps)


@pytest.mark.slow
def test_grpo_learns_on_ray_with_exact_weights_after_every_sync(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    request.getfixturevalue("ray_session")
    config = GRPOConfig(backend="ray", check_weights=True)
    _check(train(config, trace_path=str(tmp_path / "trace.json")), tmp_path / "trace.json", config.steps)


def test_local_is_refused_naming_the_way(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--backend", "local"])
    assert "--backend torchrun" in capsys.readouterr().err
    with pytest.raises(WorkerError, match=r"threads of one process.*backend='torchrun'"):
        train(GRPOConfig(backend="local", steps=1))
