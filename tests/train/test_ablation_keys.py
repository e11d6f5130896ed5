"""Config keys the one-factor ablations (launch/sweeps/toy_ablations.py) turn: each must change what the learner
does. Fixed policy λ (`sao.lambda_policy`) against an independent float64 GAE; critic attention trainable
(`critic.frozen_params` without the token mixers) in the critic's optimizer labels."""
import flax.linen as nn
import jax
import numpy as np
import pytest

from sao.models.transformer import abstract_params
from sao.train import config as config_lib
from sao.train import optim
from sao.train import targets as targets_lib
from tests.train import helpers


def _gae_reference(rewards, values, mask, lam):
  """docs/algorithm.md's skip-observation GAE (γ = 1), one sequence at a time, in float64."""
  out = np.zeros_like(rewards, np.float64)
  for b in range(rewards.shape[0]):
    next_v, last_a = 0.0, 0.0
    for t in reversed(range(rewards.shape[1])):
      a = rewards[b, t] + next_v - values[b, t] + lam[b] * last_a
      if mask[b, t]:
        next_v, last_a, out[b, t] = values[b, t], a, a
  return out


def test_fixed_policy_lambda_replaces_the_length_adaptive_one():
  rng = np.random.default_rng(0)
  mask = np.zeros((3, 12), bool)
  mask[0, 2:10], mask[1, 1:4], mask[1, 6:12], mask[2, 3:5] = True, True, True, True
  rewards = np.zeros((3, 12), np.float32)
  for b in range(3):
    rewards[b, np.flatnonzero(mask[b])[-1]] = rng.integers(0, 2)
  values = rng.uniform(0, 1, (3, 12)).astype(np.float32)
  batch = {"action_mask": mask, "token_rewards": rewards}
  lengths = mask.sum(1)
  for fixed, lam in ((0.0, 1.0 - 1.0 / (1.5 * lengths)), (0.95, np.full(3, 0.95))):
    # pylint: disable-next=protected-access
    adv, diag = targets_lib.policy_advantages(batch, values, values, 1.0, 1.5, False, fixed)
    np.testing.assert_allclose(np.asarray(adv), _gae_reference(rewards, values, mask, lam), rtol=1e-5, atol=1e-6)
    assert float(diag["advantages/lambda_mean"]) == pytest.approx(lam.mean(), rel=1e-6)


def test_lambda_policy_validation():
  c = config_lib.default_learner_config()
  assert c.sao.lambda_policy == 0.0  # the default stays length-adaptive
  c.sao.lambda_policy = 1.5
  with pytest.raises(ValueError, match="sao.lambda_policy"):
    config_lib.validate_learner_config(c)


def test_critic_attention_trainable_reaches_the_optimizer():
  def attention_labels(labels):
    flat = jax.tree_util.tree_flatten_with_path(labels)[0]
    return {label for path, label in flat if "self_attn" in jax.tree_util.keystr(path)}

  # The critic optimizer as the learner builds it (`roles.Role`): the default patterns freeze the attention, the
  # ablation's do not (the toy model has no vision tower, so nothing stays frozen).
  critic_params = nn.meta.unbox(abstract_params(helpers.model_config(), critic=True))
  for overrides, expected, frozen_count in (({}, optim.FROZEN, lambda n: n > 0),
                                            ({"critic.frozen_params": (".*visual.*",)}, optim.TRAINABLE,
                                             lambda n: n == 0)):
    critic = helpers.learner_config(**overrides).critic
    _, labels, counts = optim.make_optimizer(critic.optimizer, critic_params, tuple(critic.frozen_params), "critic")
    assert attention_labels(labels) == {expected} and frozen_count(counts.frozen), overrides
