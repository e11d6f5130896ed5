"""The learner config of each recipe phase (`sao.train.phases`): what each overrides, and nothing else."""
from __future__ import annotations

import ml_collections
import pytest

from sao.train import phases
from tests.train import helpers


def _run_config(algorithm: str, **recipe) -> ml_collections.ConfigDict:
  recipe = dict(dict(sft_learning_rate=3e-3, sft_steps=8, value_pretrain_steps=5), **recipe)
  return ml_collections.ConfigDict(dict(learner=helpers.learner_config(algorithm=algorithm), recipe=recipe,
                                        rollout=dict(batch_size=8, max_total_tokens=30)))


def _differences(got: ml_collections.ConfigDict, want: ml_collections.ConfigDict) -> dict:
  flat = lambda c, p="": ({k: v for key, value in c.items() for k, v in flat(value, f"{p}{key}.").items()}
                          if isinstance(c, (dict, ml_collections.ConfigDict)) else {p[:-1]: c})
  got, want = flat(got.to_dict()), flat(want.to_dict())
  assert got.keys() == want.keys()
  return {k: got[k] for k in got if got[k] != want[k]}


def test_sft_config_is_an_actor_only_cosine_schedule_over_the_sft_steps():
  config = _run_config("sao")
  assert _differences(phases.sft_config(config), config.learner) == {
      "algorithm": "grpo", "actor.optimizer.learning_rate": 3e-3, "actor.optimizer.warmup_steps": 4,
      "actor.optimizer.total_steps": 9, "actor.optimizer.schedule": "cosine", "actor.optimizer.end_lr_fraction": 0.1}
  assert phases.sft_config(_run_config("sao", sft_steps=100)).actor.optimizer.warmup_steps == 10


def test_value_pretraining_holds_the_actor_past_its_last_step():
  config = _run_config("sao")
  assert _differences(phases.value_pretrain_config(config), config.learner) == {"sao.critic_warmup_steps": 6}


@pytest.mark.parametrize("algorithm", ["sao", "gspo"])
def test_rl_config_loads_the_pretrained_critic_only_for_sao_and_only_when_it_exists(algorithm):
  config = _run_config(algorithm)
  assert _differences(phases.rl_config(config), config.learner) == {}
  assert _differences(phases.rl_config(config, "/v", has_value_init=False), config.learner) == {}
  loaded = _differences(phases.rl_config(config, "/v", has_value_init=True), config.learner)
  assert loaded == ({"critic.init": "checkpoint", "critic.init_path": "/v"} if algorithm == "sao" else {})


def test_phase_configs_do_not_change_the_run_config():
  config = _run_config("sao")
  before = config.to_dict()
  phases.sft_config(config), phases.value_pretrain_config(config), phases.rl_config(config, "/v", True)
  assert config.to_dict() == before
