"""sao.core.losses and metrics against float64 references, plus gradient and accumulation properties."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sao.core import losses, metrics
from tests.core import reference as ref
from tests.core.test_advantages import agent_mask


def policy_inputs(seed, batch=5, num_tokens=29, spread=1.0):
  rng = np.random.default_rng(seed)
  mask = agent_mask(rng, batch, num_tokens)
  logp = -rng.exponential(1.0, size=(batch, num_tokens)).astype(np.float32)
  # Rollout log-probs near the trainer's, with some tokens far off so both window edges are crossed.
  rollout = (logp + rng.normal(0, spread, size=logp.shape)).astype(np.float32)
  rollout = np.minimum(rollout, 0.0)
  advantages = rng.normal(size=(batch, num_tokens)).astype(np.float32)
  return logp, rollout, advantages, mask, rng


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("window", [(0.2, 4.0), (0.7, 6.0)])
def test_dis_loss_matches_reference(seed, window):
  logp, rollout, advantages, mask, _ = policy_inputs(seed)
  loss, aux = jax.jit(losses.dis_policy_loss, static_argnums=(4, 5))(logp, rollout, advantages, mask, *window)
  want_loss, want_masked = ref.dis_loss(logp, rollout, advantages, mask, *window)
  np.testing.assert_allclose(loss, want_loss, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(aux["masked_fraction"], want_masked, rtol=1e-6)
  assert 0.0 < want_masked < 1.0  # the inputs exercise both kept and masked tokens
  np.testing.assert_allclose(aux["loss_sum"] / aux["denominator"], loss, rtol=1e-6)


def test_dis_gradient_is_exact():
  logp, rollout, advantages, mask, _ = policy_inputs(3)
  grad = jax.grad(lambda lp: losses.dis_policy_loss(lp, rollout, advantages, mask)[0])(logp)
  ratio = np.exp(logp.astype(np.float64) - rollout)
  kept = mask & (ratio > 0.2) & (ratio < 4.0)
  n = mask.sum()
  want = np.where(kept, -ratio * advantages / n, 0.0)
  np.testing.assert_allclose(grad, want, rtol=1e-5, atol=1e-7)
  grad = np.asarray(grad)
  assert np.all(grad[~kept] == 0.0)  # exactly zero outside the window and on observation tokens
  assert np.any(mask & ~kept) and np.any(kept)


def test_dis_ratio_one_on_policy():
  logp, _, advantages, mask, _ = policy_inputs(4)
  _, aux = losses.dis_policy_loss(logp, logp, advantages, mask)
  assert float(aux["masked_fraction"]) == 0.0
  np.testing.assert_allclose([aux["ratio_min"], aux["ratio_max"], aux["ratio_mean"]], 1.0, rtol=1e-6)


@pytest.mark.parametrize("seed", [0, 1])
def test_gspo_loss_matches_reference(seed):
  logp, _, _, mask, rng = policy_inputs(seed)
  old = (logp + rng.normal(0, 1e-3, size=logp.shape)).astype(np.float32)  # near-on-policy so clipping is mixed
  seq_adv = rng.normal(size=logp.shape[0]).astype(np.float32)
  loss, aux = losses.gspo_policy_loss(logp, old, seq_adv, mask)
  np.testing.assert_allclose(loss, ref.gspo_loss(logp, old, seq_adv, mask, 3e-4, 4e-4), rtol=1e-4, atol=1e-6)
  assert float(aux["denominator"]) == float(mask.any(-1).sum())


def test_gspo_gradient_matches_finite_differences_in_float64():
  logp, _, _, mask, rng = policy_inputs(5, batch=3, num_tokens=8)
  old = logp + rng.normal(0, 1e-2, size=logp.shape)
  seq_adv = rng.normal(size=3)
  with jax.enable_x64(True):
    f = lambda lp: losses.gspo_policy_loss(lp, old, seq_adv, mask, 0.05, 0.05)[0]
    lp = jnp.asarray(logp, jnp.float64)
    grad = np.asarray(jax.grad(f)(lp))
    eps = 1e-6
    numeric = np.zeros_like(grad)
    for idx in zip(*np.nonzero(mask)):
      bump = np.zeros_like(grad)
      bump[idx] = eps
      numeric[idx] = (f(lp + bump) - f(lp - bump)) / (2 * eps)
    np.testing.assert_allclose(grad, numeric, rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("seq_level", [False, True])
def test_ppo_clip_loss_matches_reference(seq_level):
  logp, rollout, advantages, mask, rng = policy_inputs(6, spread=0.3)
  if seq_level:
    advantages = rng.normal(size=logp.shape[0]).astype(np.float32)
    full = np.broadcast_to(advantages[:, None], logp.shape)
  else:
    full = advantages
  loss, aux = losses.ppo_clip_policy_loss(logp, rollout, advantages, mask, 0.2, 0.28)
  np.testing.assert_allclose(loss, ref.ppo_clip_loss(logp, rollout, full, mask, 0.2, 0.28), rtol=1e-5, atol=1e-6)
  assert 0.0 < float(aux["clip_fraction"]) < 1.0


@pytest.mark.parametrize("clip", [None, 0.2])
def test_value_loss_matches_reference(clip):
  rng = np.random.default_rng(7)
  mask = agent_mask(rng, 4, 21)
  values = rng.normal(size=(4, 21)).astype(np.float32)
  returns = rng.normal(size=(4, 21)).astype(np.float32)
  old = (values + rng.normal(0, 0.5, size=values.shape)).astype(np.float32)
  loss, aux = losses.value_loss(values, returns, mask, old_values=old, clip=clip)
  np.testing.assert_allclose(loss, ref.value_loss(values, returns, mask, old, clip), rtol=1e-5)
  grad = jax.grad(lambda v: losses.value_loss(v, returns, mask)[0])(values)
  np.testing.assert_allclose(grad, np.where(mask, (values - returns) / mask.sum(), 0.0), rtol=1e-5, atol=1e-7)


def test_nll_loss_and_gradient():
  logp, _, _, mask, _ = policy_inputs(4)
  loss, aux = losses.nll_loss(logp, mask)
  n = mask.sum()
  np.testing.assert_allclose(loss, -np.sum(np.where(mask, logp.astype(np.float64), 0.0)) / n, rtol=1e-5)
  assert float(aux["denominator"]) == n
  grad = jax.grad(lambda lp: losses.nll_loss(lp, mask)[0])(logp)
  np.testing.assert_allclose(grad, np.where(mask, -1.0 / n, 0.0), rtol=1e-6)
  empty, _ = losses.nll_loss(logp, np.zeros_like(mask))
  assert float(empty) == 0.0
  with pytest.raises(ValueError, match="action_mask"):
    losses.nll_loss(logp, mask.astype(np.float32))


def test_sum_and_denominator_make_micro_batch_accumulation_exact():
  logp, rollout, advantages, mask, _ = policy_inputs(8, batch=8)
  full_grad = jax.grad(lambda lp: losses.dis_policy_loss(lp, rollout, advantages, mask)[0])(logp)
  denominator = losses.dis_policy_loss(logp, rollout, advantages, mask)[1]["denominator"]
  acc = np.zeros_like(logp)
  for sl in (slice(0, 3), slice(3, 8)):
    acc[sl] = jax.grad(lambda lp: losses.dis_policy_loss(lp, rollout[sl], advantages[sl], mask[sl])[1]["loss_sum"])(
        logp[sl])
  np.testing.assert_allclose(acc / denominator, full_grad, rtol=1e-6, atol=1e-8)


def test_explained_variance():
  rng = np.random.default_rng(9)
  mask = agent_mask(rng, 5, 30)
  returns = rng.normal(size=(5, 30)).astype(np.float32)
  values = (returns + rng.normal(0, 0.5, size=returns.shape)).astype(np.float32)
  np.testing.assert_allclose(metrics.explained_variance(values, returns, mask),
                             ref.explained_variance(values, returns, mask), rtol=1e-5)
  np.testing.assert_allclose(metrics.explained_variance(returns, returns, mask), 1.0, rtol=1e-6)
  # Constant returns: undefined, reported as 0.
  assert float(metrics.explained_variance(values, np.ones_like(returns), mask)) == 0.0


def test_loss_bad_inputs():
  logp, rollout, advantages, mask, _ = policy_inputs(0)
  with pytest.raises(ValueError, match="rollout_logprobs"):
    losses.dis_policy_loss(logp, rollout[:, :-1], advantages, mask)
  with pytest.raises(ValueError, match="advantages"):
    losses.dis_policy_loss(logp, rollout, advantages[:, :-1], mask)
  with pytest.raises(ValueError, match="action_mask"):
    losses.dis_policy_loss(logp, rollout, advantages, mask.astype(np.float32))
  with pytest.raises(ValueError, match="ratio_low"):
    losses.dis_policy_loss(logp, rollout, advantages, mask, 1.2, 4.0)
  with pytest.raises(ValueError, match="seq_advantages"):
    losses.gspo_policy_loss(logp, rollout, advantages, mask)
  with pytest.raises(ValueError, match="old_values"):
    losses.value_loss(logp, rollout, mask, clip=0.2)
