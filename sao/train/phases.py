"""The learner config of each phase of the recipe, derived from a run's config, and the update programs they compile.

    supervised warm start  `sft_config`             GRPO-shaped actor-only NLL on demonstrations (`recipe.sft_steps`)
    value pretraining      `value_pretrain_config`  critic-only: the actor waits past the last pretraining step
    RL                     `rl_config`              `config.learner`, the critic loaded from value pretraining's save

A phase's learner is `Learner(<phase>_config(config), model_config, params)`; `ahead_programs` compiles the later
phases' programs on abstract learners of the same configs (`sao.train.trainer.Trainer`, during the warm start).
"""
from __future__ import annotations

from typing import Any, Iterator

import ml_collections

from sao import run_config
from sao.models.config import ModelConfig
from sao.train.learner import Learner


def learner_config(config: ml_collections.ConfigDict, **overrides: Any) -> ml_collections.ConfigDict:
  """A copy of `config.learner` with `overrides` (dotted keys) set; `config` is not changed."""
  return run_config.set_all(ml_collections.ConfigDict(config.learner.to_dict()), overrides)


def sft_config(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """The supervised warm start's: `recipe.sft_learning_rate` with 10 warm-up steps (at most half of
  `recipe.sft_steps`) and a cosine decay to 10 % over the SFT steps."""
  r = config.recipe
  # actor_loss "": the RL phase's loss (e.g. "tis", which reads SAO's token advantages) need not fit GRPO; the warm
  # start trains the "sft" loss either way.
  return learner_config(config, algorithm="grpo", actor_loss="", **{
      "actor.optimizer.learning_rate": r.sft_learning_rate,
      "actor.optimizer.warmup_steps": min(10, r.sft_steps // 2), "actor.optimizer.total_steps": r.sft_steps + 1,
      "actor.optimizer.schedule": "cosine", "actor.optimizer.end_lr_fraction": 0.1})


def value_pretrain_config(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """Value pretraining's: critic warm-up past its last step (and the step count deciding, not the critic's explained
  variance), so the actor never updates."""
  return learner_config(config, **{"sao.critic_warmup_steps": config.recipe.value_pretrain_steps + 1,
                                   "sao.actor_start": "steps"})


def rl_config(config: ml_collections.ConfigDict, value_init: str = "",
              has_value_init: bool = False) -> ml_collections.ConfigDict:
  """The RL phase's: `config.learner`, with SAO's critic loaded from `value_init` when `has_value_init`."""
  overrides = {}
  if config.learner.algorithm == "sao" and has_value_init:
    overrides = {"critic.init": "checkpoint", "critic.init_path": value_init}
  return learner_config(config, **overrides)


def ahead_programs(config: ml_collections.ConfigDict, model_config: ModelConfig) -> Iterator[str]:
  """Compiles, one program per iteration (yielding its name), the update programs of the phases after the warm
  start — value pretraining's critic (SAO with `recipe.value_pretrain_steps`), then the RL learner's — on abstract
  learners (`actor_params=None`: nothing is allocated or loaded, the critic's init included) of the same configs as
  the real ones, so their executables are the ones the real learners' first calls look up."""
  phases = []
  if config.learner.algorithm == "sao" and config.recipe.value_pretrain_steps > 0:
    phases.append((value_pretrain_config(config), ("critic",)))  # the actor does not train there
  phases.append((rl_config(config), None))
  for phase_config, roles in phases:
    learner = Learner(phase_config, model_config, None)
    yield from learner.precompile(config.rollout.batch_size, config.rollout.max_total_tokens, roles)
