"""The issue-48 sweep `toy_critic_matters`: SAO on search_chain against the same config with its critic frozen at
initialisation, paired by seed; the frozen arm changes exactly the critic's learning rate, and a learning rate of 0
leaves the critic's parameters where they started."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from launch import sweep as s
from tests.launch.test_sweep_issue21 import _flat
from sao.train import optim



def test_arms_are_paired_by_seed_and_differ_in_the_critic_lr_only():
  runs = s.load_sweep(s.sweep_path("toy_critic_matters"))
  assert [r.name for r in runs] == [f"{arm}-seed{seed}" for seed in range(5) for arm in ("sao", "frozen_critic")]
  s.check_equal_budgets(runs)
  reference = _flat(s.run_config_of(runs[0]))
  assert reference["env.name"] == "search_chain" and reference["learner.algorithm"] == "sao"
  for run in runs:
    s.validate_run(run)
  changed = {k: v for k, v in _flat(s.run_config_of(runs[1])).items() if v != reference[k]}
  assert changed == {"learner.critic.optimizer.learning_rate": 0.0}
  assert s.load_analysis(s.sweep_path("toy_critic_matters"))["reference"] == "sao"


def test_learning_rate_zero_freezes_the_critic():
  """The frozen arm's critic optimiser (the toy's: no warmup, cosine schedule, clip 10, AdamW) at learning rate 0
  moves no parameter, whatever the gradients."""
  config = s.run_config_of(s.load_sweep(s.sweep_path("toy_critic_matters"))[1]).learner.critic.optimizer
  assert config.learning_rate == 0.0
  params = {"w": jnp.arange(6.0).reshape(2, 3), "b": jnp.ones(3)}
  tx, _, _ = optim.make_optimizer(config, params, frozen_patterns=(), role="critic")
  state = tx.init(params)
  for step in range(3):
    grads = jax.tree.map(lambda p: jnp.full_like(p, 1.0 + step), params)
    updates, state = tx.update(grads, state, params)
    moved = optim.apply_updates(params, updates, state)
    for name in params:
      np.testing.assert_array_equal(np.asarray(moved[name]), np.asarray(params[name]))
    params = moved
