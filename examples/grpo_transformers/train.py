"""GRPO on a transformers ``LlamaForCausalLM``: an FSDP2 trainer, a colocated reference, a separate rollout group.

    python examples/grpo_transformers/train.py --backend torchrun     # starts its 3 processes itself
    python examples/grpo_transformers/train.py --backend ray
    torchrun --standalone --nproc-per-node=3 examples/grpo_transformers/train.py --backend torchrun

The model is built from a config (2 layers, 17 tokens, random init: nothing
is downloaded). The trainer group holds the actor, sharded with FSDP2
(``fully_shard``) over the group's own process group
(``collective.init_process_group()``), and the frozen reference beside it in
the same processes. The rollout group samples with ``model.generate``; at the
start of every step ``WeightSync`` moves the actor's DTensors to it as they
are and checks the bytes (``verify=True``). The task: emit token 7. The
reward is the fraction of sampled tokens that are 7 (about 1/17 at first).
``local`` cannot run it: its ranks are threads of one process, and a process
holds one torch process group.

A failed step is recovered: both roles declare their FSDP2 modules and the
actor its optimizer (``sharded_modules``, ``sharded_optimizers``), and
define ``recover_sharded_state``. After a call that failed, the library
checks every rank's FSDP2 state before the next call and, where a rank was
left mid-step (a raise inside backward), runs that hook on every rank: the
actor rebuilds model, ``fully_shard`` and optimizer and restores the copy it
kept at the start of the step; the reference rebuilds itself. The driver
then retries the step. ``--fault-step N`` plants a raise inside backward on
trainer rank 1 at step N, once.

``--async-staleness K`` trains asynchronously (``docs/async-rl.md``): a
``RolloutStream`` keeps the rollout generating while the trainer trains,
each batch stamped with the weight version it was made with, and
``MaxStaleness(K)`` keeps every trained-on batch at most K versions behind
the trainer. Each rollout rank takes the actor's new weights between its
generate calls.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from dispatchcore import (
    DataProto,
    Dispatch,
    MaxStaleness,
    RolloutStream,
    WeightSync,
    Worker,
    WorkerError,
    WorkerGroup,
    collective,
    create_colocated_worker_cls,
    real_rows,
    reduce_metrics_mode,
    register,
    trace,
    versioned,
)

VOCAB = 17  # odd, so FSDP2 splits the embedding's rows 9 + 8 over 2 ranks (uneven shards)
TARGET = 7  # the token the reward asks for


@dataclass(frozen=True)
class GRPOConfig:
    """Everything every rank and the driver need (sent to the ranks as it is)."""

    backend: str = "torchrun"
    trainer_ranks: int = 2
    rollout_ranks: int = 1
    steps: int = 20
    prompts: int = 3  # per step, each sampled `samples` times: 15 rows, which 2 trainer ranks split 8 + 7 (padded)
    samples: int = 5
    prompt_len: int = 4
    response_len: int = 6
    lr: float = 1e-2
    kl_coef: float = 0.01
    seed: int = 0
    check_weights: bool = False  # after every sync, compare the rollout's bytes with the gathered full parameters
    fault_step: int | None = None  # trainer rank 1 raises inside backward at this step, once; the step is retried
    async_staleness: int | None = None  # train asynchronously, batches at most this many versions old (None: sync)


@dataclass(frozen=True)
class StepResult:
    step: int
    reward: float
    loss: float
    kl: float
    rows: int  # the real rows the trainer's ranks trained on, summed (padding left out)
    weights_exact: bool | None  # None unless `check_weights`
    retried: bool = False  # the update failed once (a planted fault) and ran again after recovery
    staleness: int = 0  # trainer version - the version the batch was generated with (async: up to K)


def build_model(seed: int) -> LlamaForCausalLM:
    """The same random model on every rank that asks with the same seed."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=32,
        tie_word_embeddings=False,
        pad_token_id=0,
        bos_token_id=None,
        eos_token_id=None,
    )
    return LlamaForCausalLM(config)


def sharded_model(seed: int) -> LlamaForCausalLM:
    """``build_model`` sharded with FSDP2 (each layer, then the root) over this worker group's ranks."""
    from torch.distributed.fsdp import fully_shard

    mesh = collective.init_process_group()  # idempotent: the colocated actor and reference share it
    model = build_model(seed)
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def response_log_probs(model: LlamaForCausalLM, sequences: torch.Tensor, prompt_len: int) -> torch.Tensor:
    """Log-probability of each response token (rows x response length)."""
    logits = model(input_ids=sequences).logits[:, prompt_len - 1 : -1].float()
    return torch.log_softmax(logits, dim=-1).gather(-1, sequences[:, prompt_len:, None]).squeeze(-1)


def group_advantages(rewards: torch.Tensor, samples: int) -> torch.Tensor:
    """GRPO's advantage: each reward less its prompt group's mean, over the group's standard deviation."""
    grouped = rewards.view(-1, samples)
    centred = grouped - grouped.mean(dim=1, keepdim=True)
    return (centred / (grouped.std(dim=1, keepdim=True) + 1e-6)).reshape(-1)


def _kept(state: Any) -> Any:
    """A copy of a (possibly nested) state dict's tensors, DTensors as DTensors."""
    if isinstance(state, torch.Tensor):
        return state.detach().clone()
    if isinstance(state, dict):
        return {key: _kept(value) for key, value in state.items()}
    if isinstance(state, list | tuple):
        return type(state)(_kept(value) for value in state)
    return state


class PlantedFault(torch.autograd.Function):
    """Identity; its backward raises where told: a fault inside backward, mid-FSDP2 step."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, fail: bool) -> torch.Tensor:
        ctx.fail = fail
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        if ctx.fail:
            raise RuntimeError("a planted fault inside backward")
        return grad, None


class Actor(Worker):
    """The policy, sharded with FSDP2; offers its DTensors to ``WeightSync`` as they are."""

    sharded_modules = ("model",)  # checked on every rank after a failed call
    sharded_optimizers = ("optimizer",)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self, config: GRPOConfig) -> None:
        self.config = config
        self.faulted = False
        self.kept: tuple[Any, Any] | None = None
        self._build()

    def _build(self) -> None:
        self.model = sharded_model(self.config.seed)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=self.config.lr)

    def recover_sharded_state(self) -> None:
        """Every rank, when the check after a failed call finds FSDP2 mid-step: rebuild, restore the kept copy.

        The copy lives in this process only: a replaced rank has none, so a run that replaces ranks loads
        its last DCP checkpoint here instead (``docs/replacing-ranks.md``).
        """
        self._build()
        kept = self.kept
        if kept is not None:  # None: no step began yet, and the rebuilt model is the initial one
            self.model.load_state_dict(kept[0])
            self.optimizer.load_state_dict(kept[1])

    def weights(self) -> dict[str, Any]:
        return dict(self.model.named_parameters())

    @register(dispatch_mode=reduce_metrics_mode("sum"))
    def update_actor(self, data: DataProto) -> dict[str, float | int]:
        """One GRPO step (on-policy: the PPO ratio is 1, so its clip never acts) with a k3 KL to the reference.

        Every rank runs forward and backward on its whole chunk (FSDP2's
        collectives need all of them); padding rows are masked out, and the
        loss is scaled so that FSDP2's gradient mean over ranks is the mean
        over the real rows of the whole batch.  The state before the step is
        kept (in memory: a real run would load its last DCP checkpoint) for
        :meth:`recover_sharded_state`.
        """
        self.kept = _kept((self.model.state_dict(), self.optimizer.state_dict()))
        cfg, rows = self.config, data.meta_info["total_rows"]
        sequences = data.batch["sequences"]
        real = real_rows(data)
        mask = (torch.arange(len(sequences)) < real).float()
        fail = self.rank == 1 and data.meta_info["step"] == cfg.fault_step and not self.faulted
        self.faulted = self.faulted or fail
        log_prob = PlantedFault.apply(response_log_probs(self.model, sequences, cfg.prompt_len), fail)
        delta = data.batch["ref_log_prob"] - log_prob
        kl = (delta.exp() - delta - 1).mean(dim=-1) * mask
        per_row = (-(data.batch["advantages"][:, None] * log_prob).mean(dim=-1) + cfg.kl_coef * kl) * mask
        self.optimizer.zero_grad()
        (per_row.sum() * self.world_size / rows).backward()
        self.optimizer.step()
        return {"loss": float(per_row.detach().sum()) / rows, "kl": float(kl.detach().sum()) / rows, "rows": real}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def full_weights(self) -> dict[str, torch.Tensor]:
        """Every parameter gathered whole (a collective: every rank runs it)."""
        from torch.distributed.tensor import DTensor

        return {name: p.full_tensor() for name, p in self.model.named_parameters() if isinstance(p, DTensor)}


class Reference(Worker):
    """The frozen initial policy, sharded like the actor, in the same processes."""

    sharded_modules = ("model",)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self, config: GRPOConfig) -> None:
        self.prompt_len, self.seed = config.prompt_len, config.seed
        self.model = sharded_model(config.seed).requires_grad_(False)

    def recover_sharded_state(self) -> None:
        """Frozen: rebuilt as it was made, so every rank's FSDP2 state starts alike again."""
        self.model = sharded_model(self.seed).requires_grad_(False)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_ref_log_prob(self, data: DataProto) -> DataProto:
        with torch.no_grad():
            ref = response_log_probs(self.model, data.batch["sequences"], self.prompt_len)
        return DataProto.from_dict({"ref_log_prob": ref})


class Rollout(Worker):
    """Samples with ``generate``; never trains: its weights come from the actor every step."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self, config: GRPOConfig) -> None:
        self.config = config
        self.model = build_model(config.seed + 1).requires_grad_(False)  # other weights: the first sync replaces them

    def load_weights(self, weights: list[tuple[str, torch.Tensor]]) -> None:
        """``WeightSync``'s apply hook: one bucket of ``(name, full tensor)``."""
        for name, tensor in weights:
            self.model.get_parameter(name).copy_(tensor)

    def weights(self) -> dict[str, torch.Tensor]:  # what verify=True reads back
        return dict(self.model.named_parameters())

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def held_weights(self) -> dict[str, torch.Tensor]:
        return {name: p.detach().clone() for name, p in self.model.named_parameters()}

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    @versioned  # the rows carry the weight version they were made with (read by RolloutStream)
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        cfg = self.config
        ids = prompts.batch["prompts"]
        torch.manual_seed(prompts.meta_info["seed"] * 100 + self.rank)  # `generate` samples from torch's global RNG
        sequences = self.model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            do_sample=True,
            top_k=0,
            top_p=1.0,
            temperature=1.0,
            max_new_tokens=cfg.response_len,
            min_new_tokens=cfg.response_len,
            pad_token_id=0,
        )
        return DataProto.from_dict({"sequences": sequences, "responses": sequences[:, cfg.prompt_len :]})


def weights_equal(full: dict[str, torch.Tensor], held: dict[str, torch.Tensor]) -> bool:
    """The same names, each with the same bytes."""
    return full.keys() == held.keys() and all(
        full[n].dtype == held[n].dtype and full[n].numpy().tobytes() == held[n].numpy().tobytes() for n in full
    )


def _placement(config: GRPOConfig) -> tuple[dict[str, Any], dict[str, Any]]:
    """Each group's options: under a torchrun launch the trainer takes the first world ranks, the rollout the rest."""
    trainer: dict[str, Any] = {"backend": config.backend}
    rollout: dict[str, Any] = {"backend": config.backend}
    if config.backend == "torchrun" and os.environ.get("TORCHELASTIC_RUN_ID"):
        n, k = config.trainer_ranks, config.rollout_ranks
        trainer["ranks"], rollout["ranks"] = list(range(n)), list(range(n, n + k))
    return trainer, rollout


def train(
    config: GRPOConfig, on_step: Callable[[StepResult], None] | None = None, trace_path: str | None = None
) -> list[StepResult]:
    """Run ``config.steps`` GRPO steps: sync, generate, reward, reference, advantages, update."""
    history: list[StepResult] = []
    trainer_options, rollout_options = _placement(config)
    with trace(trace_path), contextlib.ExitStack() as groups:
        trainer_cls = create_colocated_worker_cls({"actor": Actor, "ref": Reference})
        trainer = groups.enter_context(WorkerGroup(trainer_cls, config.trainer_ranks, **trainer_options))
        rollout = groups.enter_context(WorkerGroup(Rollout, config.rollout_ranks, **rollout_options))
        roles = trainer.spawn({"actor", "ref"})
        actor, ref = roles["actor"], roles["ref"]
        actor.init_model(config)
        ref.init_model(config)
        rollout.init_model(config)
        sync = WeightSync(actor, rollout, verify=True)
        run = _train_sync if config.async_staleness is None else _train_async
        for result in run(config, actor, ref, rollout, sync):
            history.append(result)
            if on_step is not None:
                on_step(result)
    return history


def _prompts(config: GRPOConfig, step: int, rng: torch.Generator) -> DataProto:
    """One step's prompts, each repeated ``samples`` times, padded for the trainer's ranks."""
    prompts = torch.randint(1, VOCAB, (config.prompts, config.prompt_len), generator=rng)
    return DataProto.from_dict(
        {"prompts": prompts.repeat_interleave(config.samples, dim=0)},
        meta_info={"seed": config.seed * 10_000 + step},
        auto_padding=True,
    )


def _train_on(
    config: GRPOConfig, actor: Any, ref: Any, step: int, generated: DataProto
) -> tuple[float, dict[str, Any], bool]:
    """Reward, advantages, the reference's log-probs and the update on one step's generated rows."""
    batch = DataProto.from_dict(
        {"sequences": generated.batch["sequences"], "responses": generated.batch["responses"]}, auto_padding=True
    )
    rewards = (batch.batch["responses"] == TARGET).float().mean(dim=-1)
    batch.batch["advantages"] = group_advantages(rewards, config.samples)
    batch = batch.union(ref.compute_ref_log_prob(batch))
    batch.meta_info.update(total_rows=len(batch), step=step)
    metrics, retried = _update(actor, batch)
    return float(rewards.mean()), metrics, retried


def _train_sync(config: GRPOConfig, actor: Any, ref: Any, rollout: Any, sync: WeightSync) -> Iterator[StepResult]:
    """The synchronous loop: every step syncs, then generates with the weights it trains."""
    prompts_rng = torch.Generator().manual_seed(config.seed)
    for step in range(1, config.steps + 1):
        sync(version=step)
        exact = None
        if config.check_weights:
            full = actor.full_weights()[0]
            exact = all(weights_equal(full, held) for held in rollout.held_weights())
        generated = rollout.generate_sequences(_prompts(config, step, prompts_rng))
        reward, metrics, retried = _train_on(config, actor, ref, step, generated)
        yield StepResult(step, reward, metrics["loss"], metrics["kl"], metrics["rows"], exact, retried)


def _train_async(config: GRPOConfig, actor: Any, ref: Any, rollout: Any, sync: WeightSync) -> Iterator[StepResult]:
    """The asynchronous loop: the rollout generates ahead; each step trains on a batch at most K versions old.

    Step ``s`` trains the weights of version ``s - 1`` (version 0: the initial actor, synced first); after it
    the trainer publishes version ``s``, and each rollout rank takes it between two generate calls.
    """
    prompts_rng = torch.Generator().manual_seed(config.seed)
    numbers = itertools.count(1)
    sync(version=0)
    stream = RolloutStream(
        rollout.generate_sequences,
        lambda: _prompts(config, next(numbers), prompts_rng),
        policy=MaxStaleness(config.async_staleness or 0),
        weights_from=actor,
        sync_options={"verify": True},
    )
    with stream:
        for step in range(1, config.steps + 1):
            taken = stream.take(timeout=300)
            generated = taken.data.materialize()  # the driver computes the rewards: the rows come to it
            reward, metrics, retried = _train_on(config, actor, ref, step, generated)
            stream.publish(step)
            yield StepResult(
                step, reward, metrics["loss"], metrics["kl"], metrics["rows"], None, retried, max(taken.staleness)
            )


def _update(actor: Any, batch: DataProto) -> tuple[dict[str, Any], bool]:
    """The actor's update; after a failure, once more (the library checks and recovers the sharded state first)."""
    try:
        return actor.update_actor(batch), False
    except WorkerError as exc:
        print(f"update_actor failed on rank {exc.rank} ({exc.exc_message}); retrying the step", flush=True)
        return actor.update_actor(batch), True


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=["torchrun", "ray", "local"], default="torchrun")
    parser.add_argument("--steps", type=int, default=GRPOConfig.steps)
    parser.add_argument("--seed", type=int, default=GRPOConfig.seed)
    parser.add_argument("--trace", metavar="FILE", help="write a Chrome/Perfetto trace of the run")
    parser.add_argument("--check-weights", action="store_true", help="compare rollout and trainer bytes every step")
    parser.add_argument("--fault-step", type=int, help="trainer rank 1 raises inside backward at this step, once")
    parser.add_argument(
        "--async-staleness", type=int, metavar="K", help="train asynchronously on batches at most K versions old"
    )
    args = parser.parse_args(argv)
    if args.backend == "local":
        parser.error(
            "local's ranks are threads of one process, which holds one torch process group: FSDP2 "
            "needs one per rank. Use --backend torchrun (one machine) or --backend ray"
        )
    launched = args.backend == "torchrun" and os.environ.get("TORCHELASTIC_RUN_ID")
    driver = not launched or os.environ.get("RANK") == "0"
    config = GRPOConfig(
        backend=args.backend,
        steps=args.steps,
        seed=args.seed,
        check_weights=args.check_weights,
        fault_step=args.fault_step,
        async_staleness=args.async_staleness,
    )

    def report(r: StepResult) -> None:
        exact = "" if r.weights_exact is None else f"  rollout weights exact: {r.weights_exact}"
        stale = "" if config.async_staleness is None else f"  staleness {r.staleness}"
        print(f"step {r.step:3d}  reward {r.reward:.3f}  loss {r.loss:+.4f}  kl {r.kl:.4f}{exact}{stale}", flush=True)

    history = train(config, on_step=report if driver else None, trace_path=args.trace if driver else None)
    if driver and history:
        print(f"reward {history[0].reward:.3f} -> {history[-1].reward:.3f}")
        if args.trace:
            print(f"trace written to {args.trace} (open it in https://ui.perfetto.dev)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
