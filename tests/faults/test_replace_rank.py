"""Replacing a dead rank in place: setup replay, the membership hook, retry, and the demo surviving.

Ray starts new actors (or takes spares); self-started torchrun ranks are
replaced from spare processes; local threads cannot die and refuse.
Deaths are real: ``SIGKILL`` of the rank's process.
"""

from __future__ import annotations

import os
import signal
import statistics
import time
from typing import Any

import cloudpickle
import pytest

from dispatchcore import DispatchError, WorkerDiedError, WorkerGroup
from dispatchcore.demo import DemoConfig, run_demo

from . import _replace_workers
from ._replace_workers import Restartable

# The ranks import nothing from tests/: the worker class travels by value.
cloudpickle.register_pickle_by_value(_replace_workers)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def kill(pid: int) -> float:
    """SIGKILL (as the OOM killer does it); returns the moment of death."""
    os.kill(pid, signal.SIGKILL)
    return time.monotonic()


def ray_group(ray_session: Any, **kwargs: Any) -> WorkerGroup[Restartable]:
    return WorkerGroup(Restartable, 2, backend="ray", death_timeout=5, **kwargs)


def test_replace_after_death_replays_setup_and_runs_the_hook(ray_session: Any) -> None:
    with ray_group(ray_session) as wg:
        wg.configure("cfg")
        wg.configure_each(["for-0", "for-1"])
        before = wg.state()
        kill(wg.pid()[1])
        with pytest.raises(WorkerDiedError) as died:
            wg.state()
        assert died.value.rank == 1 and died.value.method == "state"
        with pytest.raises(DispatchError, match="died"):
            wg.state()  # broken until replaced
        change = wg.replace_rank(1)
        assert change.replaced == (1,) and change.source_rank == 0 and change.generation == 1
        (r0, log0, port0), (r1, log1, port1) = wg.state()
        assert (r0, r1) == (0, 1)
        assert log0 == [*before[0][1], ("change", (1,), 0, False)]
        assert log1 == ["init", ("configure", "cfg"), ("configure_each", "for-1"), ("change", (1,), 0, True)]
        assert port0 == port1 == change.env["MASTER_PORT"] != before[0][2]


def test_replace_policy_retries_retry_safe_calls_only(ray_session: Any, record: Any) -> None:
    with ray_group(ray_session, on_rank_death="replace") as wg:
        wg.configure("cfg")
        died_at = kill(wg.pid()[1])
        results = wg.state()  # retry=True: replaced, then run again
        answered = time.monotonic() - died_at
        assert [r[0] for r in results] == [0, 1] and results[1][1][1] == ("configure", "cfg")
        kill(wg.pid()[1])
        with pytest.raises(WorkerDiedError) as died:
            wg.state_once()  # not retry-safe: the rank is replaced, the call is not rerun
        assert any("was not retried" in note for note in died.value.__notes__)
        assert [r[0] for r in wg.state_once()] == [0, 1]  # usable again
    record("replace/ray", case="policy replace, no spare", death_to_answer_s=round(answered, 3))


def test_death_to_answer_with_a_spare(ray_session: Any, record: Any) -> None:
    """Median of 3: SIGKILL rank 1, the next retry-safe call answers from a spare (benchmarks time it at length)."""
    times = []
    with ray_group(ray_session, on_rank_death="replace", spare_ranks=1) as wg:
        wg.configure("cfg")
        for _ in range(3):
            assert wg.executor.spares_ready(60) == 1  # type: ignore[attr-defined]
            died_at = kill(wg.pid()[1])
            assert [r[0] for r in wg.state()] == [0, 1]
            times.append(time.monotonic() - died_at)
    record(
        "replace/ray",
        case="policy replace, 1 spare (median of 3)",
        death_to_answer_s=round(statistics.median(times), 3),
        max_s=round(max(times), 3),
    )


def test_torchrun_replaces_from_spares(record: Any) -> None:
    """Self-started torchrun: 3 spares, 3 deaths (median); a fourth death finds none left."""
    times = []
    with WorkerGroup(Restartable, 2, backend="torchrun", death_timeout=5, on_rank_death="replace", spare_ranks=3) as wg:
        wg.configure("cfg")
        wg.configure_each(["for-0", "for-1"])
        for _ in range(3):
            died_at = kill(wg.pid()[1])
            (r0, _, port0), (r1, log1, port1) = wg.state()
            times.append(time.monotonic() - died_at)
            assert (r0, r1) == (0, 1) and port0 == port1
            assert log1[:3] == ["init", ("configure", "cfg"), ("configure_each", "for-1")]
        kill(wg.pid()[1])
        with pytest.raises(
            DispatchError,
            match=r"^1 rank needs replacing \(1 dead\); 0 spares left: create the group with spare_ranks=4 ",
        ):
            wg.state()
    record(
        "replace/torchrun",
        case="policy replace, spares (median of 3)",
        death_to_answer_s=round(statistics.median(times), 3),
        max_s=round(max(times), 3),
    )


def test_replace_refused_where_ranks_cannot_restart() -> None:
    with WorkerGroup(Restartable, 2, backend="local") as wg:
        with pytest.raises(DispatchError, match="cannot replace ranks"):
            wg.replace_rank(1)
        with pytest.raises(ValueError, match=r"rank numbers in 0\.\.1"):
            wg.replace_rank(2)
    with pytest.raises(ValueError, match="on_rank_death must be one of"):
        WorkerGroup(Restartable, 1, backend="local", on_rank_death="restart")


def test_new_rank_takes_the_survivors_trained_state(ray_session: Any) -> None:
    """The demo actor's hook copies weights and optimizer state: after a retried step all ranks agree."""
    import ray
    import torch

    from dispatchcore import DataProto
    from dispatchcore.demo.task import make_prompts
    from dispatchcore.demo.workers import ActorWorker, ModelConfig

    config = ModelConfig()
    with WorkerGroup(ActorWorker, 2, backend="ray", death_timeout=5, on_rank_death="replace") as wg:
        wg.init_model(config)
        batch = DataProto.from_dict({"prompts": make_prompts(8, config.length, torch.Generator().manual_seed(0))})
        batch = batch.union(wg.generate_sequences(batch))
        batch.batch["advantages"] = torch.linspace(-1, 1, len(batch))
        batch.batch["ref_log_prob"] = batch.batch["old_log_prob"]
        batch.meta_info["total_rows"] = len(batch)
        wg.update_actor(batch)
        trained = wg.weights_digest()
        assert trained[0] == trained[1]
        kill(ray.get(wg.executor.actor(1).describe.remote())["pid"])  # type: ignore[attr-defined]
        wg.update_actor(batch)  # retry=True: rank 1 replaced (fresh weights), state copied, step rerun
        after = wg.weights_digest()
        assert after[0] == after[1] != trained[0]


@pytest.mark.timeout(240)
def test_demo_survives_a_rank_killed_mid_run(ray_session: Any) -> None:
    """The actor+reference rank 1 is SIGKILLed after step 4; training goes on and learns."""
    import ray

    killed: list[int] = []

    def on_step(metrics: Any) -> None:
        if metrics.step != 4:
            return
        for entry in ray.util.list_named_actors(all_namespaces=True):
            name = entry["name"]
            if name.startswith("Colocated_actor_ref-") and name.endswith("-rank1"):
                actor = ray.get_actor(name, namespace=entry["namespace"])
                pid = ray.get(actor.describe.remote())["pid"]
                kill(pid)
                killed.append(pid)

    config = DemoConfig(
        backend="ray", world_size=2, steps=25, on_rank_death="replace", backend_options={"death_timeout": 5}
    )
    history = run_demo(config, on_step=on_step)
    assert len(killed) == 1 and len(history) == 25
    first = sum(m.reward for m in history[:3]) / 3
    last = sum(m.reward for m in history[-3:]) / 3
    assert first < 0.3 and last > first + 0.3, (first, last)
