"""The demo's roles: actor (rollout + training), frozen reference, reward, and an optional rollout group.

The actor and the reference are colocated on the same ranks (verl's hybrid
engine layout); the reference is an nd mesh whose replicas share one data
shard, like a tensor-parallel model.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from .. import (
    DataProto,
    Dispatch,
    MembershipChange,
    Worker,
    collective,
    make_nd_compute_dataproto_dispatch_fn,
    real_rows,
    register,
)
from .policy import TinyPolicy
from .task import rewards

REF_MESH = "ref"


@dataclass(frozen=True)
class ModelConfig:
    """What every rank needs to build the same model (sent ONE_TO_ALL)."""

    length: int = 6
    hidden: int = 32
    lr: float = 0.05
    kl_coef: float = 0.01
    seed: int = 0


_init_lock = threading.Lock()


def rank_generator(config: ModelConfig, rank: int) -> torch.Generator:
    """Rank ``rank``'s own sampling generator (threads share torch's global RNG), seeded alike in actor and rollout."""
    return torch.Generator().manual_seed(config.seed * 1000 + rank)


def sample(policy: TinyPolicy, prompts: DataProto, generator: torch.Generator) -> DataProto:
    """Responses and their log-probs under ``policy``: one function for the actor and the rollout group."""
    responses = policy.generate(prompts.batch["prompts"], generator)
    with torch.no_grad():
        old_log_prob = policy.log_probs(prompts.batch["prompts"], responses)
    return DataProto.from_dict({"responses": responses, "old_log_prob": old_log_prob})


def _digest(policy: TinyPolicy) -> float:
    """A checksum of the weights (every rank holds the same after a step)."""
    with torch.no_grad():
        return float(sum(p.double().sum() for p in policy.parameters()))


def _build_policy(config: ModelConfig) -> TinyPolicy:
    """Identical initial weights on every rank and role (one lock: local ranks share torch's global RNG)."""
    with _init_lock:
        torch.manual_seed(config.seed)
        return TinyPolicy(config.length, config.hidden)


class ActorWorker(Worker):
    """Generates responses and trains the policy data-parallel.

    ``init_model`` is replayed on a rank that replaces a dead one, and
    :meth:`on_membership_change` copies the trained state from a survivor.
    """

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, setup=True)
    def init_model(self, config: ModelConfig) -> int:
        self.config = config
        self.policy = _build_policy(config)
        self.optimizer = torch.optim.Adam(self.policy.parameters(), lr=config.lr)
        self.generator = rank_generator(config, self.rank)
        return sum(p.numel() for p in self.policy.parameters())

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO, retry=True)
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        return sample(self.policy, prompts, self.generator)

    # Registered although WeightSync needs no @register: a colocated class forwards registered methods only.
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def weights(self) -> dict[str, torch.Tensor]:
        """What ``WeightSync`` offers the rollout group: every parameter whole (each rank holds them all)."""
        return {name: p.detach() for name, p in self.policy.named_parameters()}

    # Safe to retry: a rank dying mid-step fails the all-reduce on the others
    # before their optimizer steps, and the hook copies the survivors' state.
    @register(dispatch_mode=Dispatch.DP_COMPUTE_METRIC, retry=True)
    def update_actor(self, data: DataProto) -> dict[str, float]:
        """One policy-gradient step on the whole batch (gradients summed over ranks)."""
        real = real_rows(data)
        total_rows = int(data.meta_info["total_rows"])
        prompts, responses = data.batch["prompts"][:real], data.batch["responses"][:real]
        advantages = data.batch["advantages"][:real]
        ref_log_prob = data.batch["ref_log_prob"][:real]
        log_prob = self.policy.log_probs(prompts, responses)
        kl = log_prob - ref_log_prob
        # Sums divided by the global row count: the summed gradient is the full-batch one.
        loss = (-(advantages * log_prob) + self.config.kl_coef * kl).sum() / total_rows
        self.optimizer.zero_grad(set_to_none=False)
        loss.backward()
        grads = [p.grad for p in self.policy.parameters() if p.grad is not None]
        flat = torch.cat([g.reshape(-1) for g in grads])
        collective.all_reduce(flat, op="sum")
        for g, part in zip(grads, torch.split(flat, [g.numel() for g in grads]), strict=True):
            g.copy_(part.view_as(g))
        self.optimizer.step()
        return {"loss_sum": float(loss.detach()) * total_rows, "kl_sum": float(kl.detach().sum()), "rows": real}

    @register(dispatch_mode=Dispatch.RANK_ZERO)
    def save_checkpoint(self, path: str) -> str:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        torch.save({"policy": self.policy.state_dict(), "config": self.config.__dict__}, path)
        return path

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def weights_digest(self) -> float:
        return _digest(self.policy)

    def on_membership_change(self, change: MembershipChange) -> None:
        state = {"policy": self.policy.state_dict(), "optimizer": self.optimizer.state_dict()}
        state = collective.broadcast_object(state, src=change.source_rank)
        self.policy.load_state_dict(state["policy"])
        self.optimizer.load_state_dict(state["optimizer"])


class RolloutWorker(Worker):
    """A separate group (``--rollout-ranks K``) that never trains: it generates with the actor's weights."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, setup=True)
    def init_model(self, config: ModelConfig) -> None:
        self.policy = _build_policy(config).requires_grad_(False)
        self.generator = rank_generator(config, self.rank)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """One bucket of ``(name, tensor)`` from the actor (``WeightSync``'s apply hook)."""
        with torch.no_grad():
            for name, tensor in weights:
                self.policy.get_parameter(name).copy_(tensor)

    def weights(self) -> dict[str, torch.Tensor]:
        """What it holds (``WeightSync.verify`` reads it; a grow copies it into new ranks at the same version)."""
        return {name: p.detach() for name, p in self.policy.named_parameters()}

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO, retry=True)
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        return sample(self.policy, prompts, self.generator)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def weights_digest(self) -> tuple[float, object]:
        """The actor's ``weights_digest`` and the version last synced."""
        return _digest(self.policy), getattr(self, "weights_version", None)


class ReferenceWorker(Worker):
    """The frozen initial policy; scores responses for the KL penalty."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, setup=True)
    def init_model(self, config: ModelConfig, replicas: int) -> None:
        self.policy = _build_policy(config).requires_grad_(False)
        # ``replicas`` consecutive ranks hold one data shard (think tensor parallel).
        self._register_dispatch_collect_info(
            REF_MESH, dp_rank=self.rank // replicas, is_collect=self.rank % replicas == 0
        )

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(REF_MESH), retry=True)
    def compute_ref_log_prob(self, data: DataProto) -> DataProto:
        with torch.no_grad():
            ref = self.policy.log_probs(data.batch["prompts"], data.batch["responses"])
        return DataProto.from_dict({"ref_log_prob": ref})


class RewardWorker(Worker):
    """Checks responses against the task's answer."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, setup=True)
    def init_task(self, shift: int) -> None:
        self.shift = shift

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO, retry=True)
    def compute_reward(self, data: DataProto) -> DataProto:
        scores = rewards(data.batch["prompts"], data.batch["responses"], self.shift)
        return DataProto.from_dict({"rewards": scores})
