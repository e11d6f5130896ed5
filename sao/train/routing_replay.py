"""MoE routing replay in the learner (`learner.routing_replay`): what the batch carries and which steps read it.

On: the batcher adds `routed_experts` [B, T, L, k] (`sao.train.batching`, the engines' records from the
trajectories), the actor loss reads it beside its own keys, and the actor's log-probs -- the loss's, and π_old's
(`Learner.policy_logprobs`) -- route each recorded token to the engine's experts with the trainer's gates
(`sao.models.moe.replay_route`). The critic is a separate model with its own router and never replays. Off (the
default): nothing changes.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from sao.models.config import ModelConfig
from sao.train import actor_losses
from sao.train.batching import ROUTED_EXPERTS


def batcher_routing(config: Any, model_config: ModelConfig) -> tuple[int, int, int] | None:
  """`Batcher(routing=...)`: (layers, top_k, num_experts) when `config.routing_replay` is on, else None. ValueError
  for a policy without MoE layers."""
  if not config.routing_replay:
    return None
  if not model_config.num_experts:
    raise ValueError("learner config: routing_replay needs an MoE policy (the model has num_experts = 0)")
  return model_config.num_layers, model_config.num_experts_per_tok, model_config.num_experts


def actor_loss(loss: actor_losses.ActorLoss, config: Any) -> actor_losses.ActorLoss:
  """The loss reading `routed_experts` too when routing replay is on (its step then replays), else `loss`."""
  if not config.routing_replay or ROUTED_EXPERTS in loss.batch_keys:
    return loss
  return dataclasses.replace(loss, batch_keys=(*loss.batch_keys, ROUTED_EXPERTS))


def logprob_keys(batch: dict) -> tuple[str, ...]:
  """The device batch fields of a forward for the policy's log-probs."""
  return ("input_ids", "attention_mask") + ((ROUTED_EXPERTS,) if ROUTED_EXPERTS in batch else ())
