#!/usr/bin/env python
"""Run verl 0.9.1's own ``RayPPOTrainer`` on dispatchcore's Ray backend, with stand-in CPU workers.

Started by ``scripts/verl_parity.py --trainer``.  verl pins
``tensordict<=0.10`` and our test extras need ``>=0.15.3``, so the trainer
runs in its own venv (``--venv``; built on first use with
``python -m venv --system-site-packages`` and ``pip install verl==0.9.1``
pinned to this machine's torch and Ray).  In that venv this script (the
``--child`` half):

* copies ``verl/trainer/ppo/ray_trainer.py`` with its single-controller and
  protocol imports rewritten to ``executors_ray`` / ``dispatchcore`` (the
  rest of verl stays verl's);
* builds stand-in workers from verl's own ``verl/workers/engine_workers.py``:
  for ``ActorRolloutRefWorker`` and ``TrainingWorker``, a dispatchcore
  ``Worker`` registering every ``@register`` method under the same name,
  parameters and dispatch mode, bodies returning placeholders (no model);
* starts a local Ray with logical GPUs (``num_gpus=2``: the pools ask for
  GPUs as verl's do; nothing touches CUDA), composes verl's
  ``ppo_trainer.yaml`` for two ranks, and runs ``RayPPOTrainer(...)``,
  ``init_workers()`` and ``fit()``, printing each stage and, where it stops,
  the exception and the frame of verl's code that raised it.

It runs three times.  Pass 1 is verl's trainer as shipped: ``RayPPOTrainer(...)``
builds, and ``init_workers()`` creates the pools (``ResourcePoolManager``),
the colocated class, ``RayWorkerGroup(..., **wg_kwargs)``, ``spawn``,
``init_model`` and the reward loop, then stops at
``LLMServerManager.create`` (``ray_trainer.py``, ``init_workers``): the
rollout server, vLLM >= 0.18 or SGLang, which is not installed here and
needs a GPU (``ValueError: vllm version None not supported``).  That is the
first non-single-controller dependency.  Pass 2 stands in for the rollout
side only (``LLMServerManager``, ``AgentLoopManager``: fixed responses and
rewards, no model, no server) and keeps everything else verl's, including
its ``CheckpointEngineManager``: ``init_workers()`` completes and ``fit()``
runs its step through every single-controller call (``ray.get`` of
``actor_wg.update_weights(...)``, ``_balance_batch`` reading
``_dispatch_info``, ``compute_log_prob`` and ``update_actor`` through the nd
dispatch with TensorDicts) to the end of training.  Pass 3 adds a critic
(GAE, verl's ``TrainingWorker`` stood in; its config reads a local one-layer
Hugging Face config, no weights): ``reset``, ``set_loss_fn``, the
non-blocking ``infer_batch`` / ``train_mini_batch`` (``DataProtoFuture``
``.get()``) run too, and the step runs to the end.

Exit status 0 when passes 2 and 3 ran to the end (pass 1 stops at the rollout
server wherever vLLM/SGLang are missing; its report says where), 1 when pass
2 stopped, 2 when the harness failed.
"""

from __future__ import annotations

import argparse
import ast
import os
import re
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
VERL_VERSION = "0.9.1"
SC_BASE = r"\1from dispatchcore import"
#: verl import (module pattern) -> ours, applied to ray_trainer.py's import lines only.
REWRITES = (
    (re.compile(r"^(\s*)from verl\.single_controller\.ray(?:\.base)? import", re.M), r"\1from executors_ray import"),
    (
        re.compile(r"^(\s*)from verl\.single_controller(?:\.base)?(?:\.\w+)? import", re.M),
        r"\1from dispatchcore import",
    ),
    (re.compile(r"^(\s*)from verl\.protocol import", re.M), r"\1from dispatchcore import"),
    (re.compile(r"^(\s*)from verl import DataProto\b", re.M), r"\1from dispatchcore import DataProto"),
)


#: Modules verl's trainer imports that verl 0.9.1 does not declare (its rollout stack brings them).
UNDECLARED = ("cachetools", "uvicorn", "fastapi")


def ensure_venv(venv: Path) -> Path:
    """The venv's python, with verl installed (built here on first use)."""
    python = venv / "bin" / "python"
    check = [str(python), "-c", f"import verl, sys; sys.exit(verl.__version__ != {VERL_VERSION!r})"]
    if python.exists() and subprocess.run(check, capture_output=True).returncode == 0:
        return python
    import ray
    import torch

    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    pins = venv / "pins.txt"
    pins.write_text(f"torch=={torch.__version__.split('+')[0]}\nray=={ray.__version__}\n")
    pip = [str(python), "-m", "pip", "install", "-q", f"verl=={VERL_VERSION}", *UNDECLARED, "-c", str(pins)]
    subprocess.run(pip, check=True)
    return python


def rewritten_trainer(verl_root: Path, work: Path) -> Path:
    """``ray_trainer.py`` with its single-controller imports ported, written as ``ported_ray_trainer.py``."""
    text = (verl_root / "verl" / "trainer" / "ppo" / "ray_trainer.py").read_text()
    for pattern, replacement in REWRITES:
        text = pattern.sub(replacement, text)
    leftover = [line for line in text.splitlines() if re.match(r"\s*from verl\.(single_controller|protocol)", line)]
    if leftover:
        raise RuntimeError(f"imports left unported: {leftover}")
    out = work / "ported_ray_trainer.py"
    out.write_text(text)
    return out


def registered_methods(verl_root: Path, cls_name: str) -> list[tuple[str, list[str], str, bool]]:
    """``(name, parameters, register decorator source, is async)`` of each ``@register`` method of verl's class."""
    tree = ast.parse((verl_root / "verl" / "workers" / "engine_workers.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == cls_name:
            found = []
            for item in node.body:
                if not isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                decorators = [ast.unparse(d) for d in item.decorator_list if "register" in ast.unparse(d)]
                if decorators:
                    params = [a.arg for a in item.args.args][1:]
                    found.append((item.name, params, decorators[0], isinstance(item, ast.AsyncFunctionDef)))
            return found
    raise RuntimeError(f"verl/workers/engine_workers.py has no class {cls_name}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--verl-src", type=Path, required=True, help="directory holding verl's 'verl/' package")
    parser.add_argument("--venv", type=Path, default=Path("/tmp/verl-trainer-venv"))
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--work", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child(args.verl_src, args.work)
    python = ensure_venv(args.venv)
    work = Path(tempfile.mkdtemp(prefix="verl-trainer-"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(work)])}
    env.pop("RAY_ADDRESS", None)
    cmd = [str(python), str(Path(__file__).resolve()), "--child", "--verl-src", str(args.verl_src), "--work", str(work)]
    return subprocess.run(cmd, env=env, cwd=work, timeout=1800).returncode  # anything verl writes lands in work


# -- the child: runs in the venv ------------------------------------------------------
def stand_in_class(verl_root: Path, cls_name: str) -> type:
    """A dispatchcore Worker with verl's registered methods of ``cls_name``, bodies returning placeholders."""
    from dispatchcore import Dispatch, Worker, make_nd_compute_dataproto_dispatch_fn, register

    scope = {"Dispatch": Dispatch, "make_nd_compute_dataproto_dispatch_fn": make_nd_compute_dataproto_dispatch_fn}
    namespace: dict[str, Any] = {"__module__": "__main__", "__init__": _stand_in_init, "calls": []}
    for name, params, decorator, is_async in registered_methods(verl_root, cls_name):
        body = _make_body(name, params, is_async)
        namespace[name] = register(**_register_kwargs(decorator, scope))(body)
    return type(f"StandIn{cls_name}", (Worker,), namespace)


def _register_kwargs(decorator: str, scope: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments of verl's ``@register(...)`` decorator source, evaluated."""
    call = ast.parse(decorator, mode="eval").body
    if not isinstance(call, ast.Call):
        return {}
    kwargs = {k.arg: eval(ast.unparse(k.value), scope) for k in call.keywords if k.arg}  # noqa: S307
    if call.args:
        kwargs["dispatch_mode"] = eval(ast.unparse(call.args[0]), scope)  # noqa: S307
    return kwargs


def _stand_in_init(self: Any, *args: Any, **kwargs: Any) -> None:
    """Declare the meshes verl's workers declare (dp rank = rank); keep the config for inspection."""
    self.init_kwargs = sorted(kwargs)
    for mesh in ("actor", "ref", "train", "critic", "rollout"):
        self._register_dispatch_collect_info(mesh, dp_rank=self.rank, is_collect=True)


def _make_body(name: str, params: list[str], is_async: bool) -> Any:
    """A method called ``name`` with verl's parameters, answering like verl's (no model behind it)."""

    def answer(self: Any, *args: Any, **kwargs: Any) -> Any:
        data = args[0] if args else kwargs.get("data")
        return stand_in_answer(name, data)

    if is_async:

        async def async_answer(self: Any, *args: Any, **kwargs: Any) -> Any:
            return answer(self, *args, **kwargs)

        async_answer.__name__ = async_answer.__qualname__ = name
        return async_answer
    answer.__name__ = answer.__qualname__ = name
    return answer


def stand_in_answer(name: str, data: Any) -> Any:
    """What a stand-in returns: the DataProto methods give back their input with the fields verl adds."""
    import torch
    from tensordict import TensorDict

    from dispatchcore import DataProto

    if isinstance(data, TensorDict):
        return stand_in_tensordict(name, data)
    if not isinstance(data, DataProto):
        return None
    out = DataProto.from_dict(meta_info={"metrics": {f"{name}/stand_in": 1.0}})
    if data.batch is not None and "responses" in data.batch.keys():
        shape = data.batch["responses"].shape
        key = {"compute_log_prob": "old_log_probs", "compute_ref_log_prob": "ref_log_prob"}.get(name)
        if key:
            out = DataProto.from_dict({key: torch.zeros(shape)}, meta_info=out.meta_info)
    return out


def stand_in_tensordict(name: str, data: Any) -> Any:
    """verl's TensorDict answers: log-probs and entropy shaped like the (nested) ``input_ids``, and metrics."""
    import torch
    from verl.utils import tensordict_utils as tu

    metrics = {"mfu": 0.0, f"{name}/stand_in": 1.0}
    if name in ("compute_log_prob", "compute_ref_log_prob", "infer_batch"):
        ids = data["input_ids"]
        zeros = torch.nested.nested_tensor_from_jagged(torch.zeros(ids.values().shape), ids.offsets())
        fields = {"values": zeros} if name == "infer_batch" else {"log_probs": zeros, "entropy": zeros.clone()}
        return tu.get_tensordict(fields, {"metrics": metrics})
    return tu.get_tensordict(tensor_dict={}, non_tensor_dict={"metrics": metrics})


class StandInLLMServerManager:
    """Stands in for verl's rollout servers (vLLM / SGLang replicas): none are started."""

    @classmethod
    def create(cls, *args: Any, **kwargs: Any) -> StandInLLMServerManager:
        return cls()

    @classmethod
    def create_empty(cls, *args: Any, **kwargs: Any) -> StandInLLMServerManager:
        return cls()

    def get_client(self) -> None:
        return None

    def get_replicas(self) -> list[Any]:
        return []

    def start_profile(self) -> None:
        pass

    def stop_profile(self) -> None:
        pass


class StandInAgentLoopManager:
    """Stands in for verl's agent loop: "generates" fixed responses and their rewards (no model, no server)."""

    RESPONSE = 4

    @classmethod
    def create(cls, *args: Any, **kwargs: Any) -> StandInAgentLoopManager:
        return cls()

    def generate_sequences(self, prompts: Any) -> Any:
        import numpy as np
        import torch

        from dispatchcore import DataProto

        n, r = len(prompts), self.RESPONSE
        ids = torch.arange(8).repeat(n, 1) + 10
        responses = torch.arange(r).repeat(n, 1) + 1
        scores = torch.zeros(n, r)
        scores[:, -1] = 1.0
        extra = np.empty(n, dtype=object)
        extra[:] = [{} for _ in range(n)]
        return DataProto.from_dict(
            {
                "prompts": ids,
                "responses": responses,
                "input_ids": torch.cat([ids, responses], dim=1),
                "attention_mask": torch.ones(n, ids.shape[1] + r, dtype=torch.long),
                "position_ids": torch.arange(ids.shape[1] + r).repeat(n, 1),
                "rm_scores": scores,
            },
            {"multi_modal_inputs": extra},
            meta_info={"timing": {}},
        )


def child(verl_root: Path, work: Path) -> int:
    """Stages of the run, each reported; stops at the first that raises."""
    sys.path.insert(0, str(work))
    rewritten_trainer(verl_root, work)
    passes = {
        "1 (verl's trainer as shipped, its rollout servers included)": {"stand_in_rollout": False},
        "2 (rollout servers and agent loop stood in: not single-controller code; the rest verl's)": {
            "stand_in_rollout": True
        },
        "3 (as 2, with a critic (GAE): verl's TrainingWorker stood in beside the actor)": {
            "stand_in_rollout": True,
            "critic": True,
        },
    }
    results = {}
    for label, options in passes.items():
        print(f"## pass {label}")
        results[label] = one_pass(verl_root, **options)
    for label, status in results.items():
        print(f"## pass {label.split(' ', 1)[0]}: {'ran to the end' if status == 0 else 'stopped (see above)'}")
    return max(list(results.values())[1:])


def one_pass(verl_root: Path, stand_in_rollout: bool, critic: bool = False) -> int:
    """Build the trainer, ``init_workers()``, ``fit()``, on a fresh local Ray; 0 when all ran."""
    import ray

    stages = Stages()
    ray.init(address="local", num_cpus=4, num_gpus=2, include_dashboard=False, log_to_driver=False)
    try:
        trainer = stages.run("RayPPOTrainer(...)", lambda: build_trainer(verl_root, stand_in_rollout, critic))
        if trainer is None:
            return 1
        for label in ("init_workers()", "fit()"):
            if stages.run(label, getattr(trainer, label[:-2])) is stages.FAILED:
                return 1
        return 0
    finally:
        ray.shutdown()


class Stages:
    """Runs and reports the stages of the trainer run."""

    FAILED = object()

    def run(self, label: str, step: Any) -> Any:
        print(f"== {label}", flush=True)
        try:
            value = step()
        except Exception as exc:  # noqa: BLE001 - the report is the point
            frames = traceback.extract_tb(exc.__traceback__)
            verl_frames = [f for f in frames if "/verl/" in f.filename or "ported_ray_trainer" in f.filename]
            where = verl_frames[-1] if verl_frames else frames[-1]
            print(f"   stopped: {type(exc).__name__}: {str(exc)[:600]}")
            print(f"   at {where.filename}:{where.lineno} in {where.name}: {where.line}")
            trainer_frames = [f for f in frames if "ported_ray_trainer" in f.filename]
            if trainer_frames and trainer_frames[-1] is not where:
                t = trainer_frames[-1]
                print(f"   from RayPPOTrainer: ray_trainer.py:{t.lineno} in {t.name}: {t.line}")
            print("".join(traceback.format_exception(exc)[-12:]))
            return None if label.startswith("RayPPOTrainer") else self.FAILED
        print(f"   ok: {label}", flush=True)
        return value


def build_trainer(verl_root: Path, stand_in_rollout: bool, critic: bool = False) -> Any:
    """verl's RayPPOTrainer (ported module) over stand-in workers, verl's config for two ranks."""
    import ported_ray_trainer as trainer_module
    import ray
    from hydra import compose, initialize_config_dir
    from verl.trainer.ppo.utils import Role

    from executors_ray import RayWorkerGroup, ResourcePoolManager

    if stand_in_rollout:
        import verl.experimental.agent_loop as agent_loop

        trainer_module.LLMServerManager = StandInLLMServerManager  # type: ignore[attr-defined]
        agent_loop.AgentLoopManager = StandInAgentLoopManager  # type: ignore[attr-defined]
    with initialize_config_dir(config_dir=str(verl_root / "verl" / "trainer" / "config"), version_base=None):
        overrides = [*CONFIG_OVERRIDES, f"trainer.default_local_dir={Path.cwd()}/ckpt"]
        if critic:
            overrides += [*CRITIC_OVERRIDES, f"critic.model.path={tiny_model_dir()}"]
        config = compose("ppo_trainer", overrides=overrides)
    actor = stand_in_class(verl_root, "ActorRolloutRefWorker")
    mapping: dict[Any, Any] = {Role.ActorRollout: ray.remote(actor)}
    if critic:
        mapping[Role.Critic] = ray.remote(stand_in_class(verl_root, "TrainingWorker"))
    manager = ResourcePoolManager({"global_pool": [2]}, dict.fromkeys(mapping, "global_pool"))
    dataset = TinyPrompts(8)
    return trainer_module.RayPPOTrainer(
        config=config,
        tokenizer=None,
        role_worker_mapping=mapping,
        resource_pool_manager=manager,
        ray_worker_group_cls=RayWorkerGroup,
        train_dataset=dataset,
        val_dataset=dataset,
        collate_fn=collate,
    )


CONFIG_OVERRIDES = [
    "trainer.n_gpus_per_node=2",
    "trainer.nnodes=1",
    "trainer.device=cpu",
    "trainer.logger=[console]",
    "trainer.val_before_train=False",
    "trainer.total_training_steps=1",
    "trainer.save_freq=-1",
    "trainer.test_freq=-1",
    "data.train_batch_size=4",
    "algorithm.adv_estimator=grpo",
    "actor_rollout_ref.rollout.n=1",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    "actor_rollout_ref.actor.use_kl_loss=False",
    "algorithm.use_kl_in_reward=False",
    "actor_rollout_ref.model.path=stand-in",
    "actor_rollout_ref.rollout.name=vllm",
    "trainer.resume_mode=disable",
]


CRITIC_OVERRIDES = [
    "algorithm.adv_estimator=gae",
    "critic.ppo_mini_batch_size=4",
    "critic.ppo_micro_batch_size_per_gpu=2",
    "+critic.model.load_tokenizer=False",
]


def tiny_model_dir() -> Path:
    """A local Hugging Face config (a 1-layer Llama shape, no weights): what verl's critic config reads."""
    from transformers import LlamaConfig

    path = Path.cwd() / "stand-in-model"
    shape = {"hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 1, "num_attention_heads": 1}
    LlamaConfig(architectures=["LlamaForCausalLM"], **shape).save_pretrained(path)
    return path


class TinyPrompts:
    """A map-style dataset of a few fixed prompts, rows shaped as verl's RL dataset gives them."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, Any]:
        import torch

        return {  # as verl 0.9.1's RLHFDataset: one dummy tensor, the agent loop tokenises the prompt
            "dummy_tensor": torch.tensor([0], dtype=torch.uint8),
            "raw_prompt": [{"role": "user", "content": f"prompt {i}"}],
            "data_source": "stand-in",
            "reward_model": {"ground_truth": "0"},
            "extra_info": {"index": i},
        }


def collate(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """verl's collate rule: tensors stacked, everything else an object array."""
    import numpy as np
    import torch

    out: dict[str, Any] = {}
    for key in rows[0]:
        values = [r[key] for r in rows]
        if isinstance(values[0], torch.Tensor):
            out[key] = torch.stack(values)
        else:
            array = np.empty(len(values), dtype=object)
            array[:] = values
            out[key] = array
    return out


if __name__ == "__main__":
    sys.exit(main())
