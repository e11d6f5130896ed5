"""V-trace critic targets (`sao.core.vtrace`) against a float64 term-by-term sum of Espeholt et al.'s eq. (1)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sao.core import advantages, vtrace
from tests.core import reference as ref
from tests.core.test_advantages import agent_mask


def _inputs(seed, batch=6, num_tokens=33, spread=0.7):
  rng = np.random.default_rng(seed)
  mask = agent_mask(rng, batch, num_tokens)
  rewards = rng.normal(size=(batch, num_tokens))  # also on observation tokens: they must be ignored
  values = rng.normal(size=(batch, num_tokens))
  log_ratio = rng.normal(0.0, spread, size=(batch, num_tokens))  # both sides of 1, both clips bind
  return rewards, values, log_ratio, mask


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("gamma,lam,rho_bar,c_bar", [(1.0, 1.0, 1.0, 1.0), (0.97, 0.9, 2.0, 1.0),
                                                     (1.0, 0.5, 1.0, 0.5)])
def test_matches_the_unrolled_sum_in_float64(seed, gamma, lam, rho_bar, c_bar):
  rewards, values, log_ratio, mask = _inputs(seed)
  want = ref.vtrace(rewards, values, log_ratio, mask, gamma, lam, rho_bar, c_bar)
  with jax.enable_x64(True):
    fn = jax.jit(vtrace.vtrace_returns, static_argnums=(4, 5, 6, 7))
    got, aux = fn(*(jnp.asarray(x, jnp.float64) for x in (rewards, values, log_ratio)), mask, gamma, lam, rho_bar,
                  c_bar)
    assert got.dtype == jnp.float64
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-10, atol=1e-10)
  k = np.exp(log_ratio)
  assert float(aux["rho_clipped"]) == np.sum(mask & (k > rho_bar * (1 + vtrace.CLIP_COUNT_RTOL))) > 0
  assert float(aux["c_clipped"]) == np.sum(mask & (k > c_bar * (1 + vtrace.CLIP_COUNT_RTOL))) > 0
  assert float(aux["tokens"]) == mask.sum()


def test_float_noise_of_on_policy_ratios_is_not_counted_as_clipping():
  """Ratios 1 ± 1e-6 (the trainer rescoring what the engine sampled, same weights) at ρ̄ = c̄ = 1: no clip counted,
  while a ratio 1 % over the bar is."""
  rewards, values, log_ratio, mask = _inputs(3)
  noise = np.where(np.arange(log_ratio.size).reshape(log_ratio.shape) % 2, 1e-6, -1e-6)
  _, aux = vtrace.vtrace_returns(rewards, values, noise, mask, 1.0, 1.0, 1.0, 1.0)
  assert float(aux["rho_clipped"]) == 0 and float(aux["c_clipped"]) == 0
  over = np.where(mask, np.log(1.01), 0.0)
  _, aux = vtrace.vtrace_returns(rewards, values, over, mask, 1.0, 1.0, 1.0, 1.0)
  assert float(aux["rho_clipped"]) == float(aux["c_clipped"]) == mask.sum() > 0


def test_float32_agrees_with_the_reference():
  rewards, values, log_ratio, mask = _inputs(5, batch=4, num_tokens=300)
  got, _ = vtrace.vtrace_returns(*(x.astype(np.float32) for x in (rewards, values, log_ratio)), mask, 1.0, 0.95)
  want = ref.vtrace(rewards, values, log_ratio, mask, 1.0, 0.95, 1.0, 1.0)
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("lam", [1.0, 0.8, 0.0])
def test_on_policy_it_is_the_gae_return(lam):
  """k ≡ 1 (and ρ̄, c̄ ≥ 1): `v = GAE(r, V, γ, λ) + V`, observation tokens bridged the same way."""
  rewards, values, _, mask = _inputs(3)
  with jax.enable_x64(True):
    r, v = jnp.asarray(rewards), jnp.asarray(values)
    got, _ = vtrace.vtrace_returns(r, v, jnp.zeros_like(r), mask, 0.99, lam, 1.0, 1.0)
    _, want = advantages.gae(r, v, mask, 0.99, lam, method="scan")
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-12, atol=1e-12)


def test_observation_tokens_change_nothing():
  """Inserting observation tokens (any reward, value or ratio on them) leaves the action tokens' targets as they are."""
  rewards, values, log_ratio, _ = _inputs(7, batch=1, num_tokens=10)
  dense = np.ones((1, 10), bool)
  got_dense, _ = vtrace.vtrace_returns(rewards, values, log_ratio, dense, 0.9, 0.7)
  spread = np.zeros((1, 25), bool)
  positions = np.array([0, 1, 5, 6, 7, 12, 13, 19, 20, 24])
  spread[0, positions] = True
  wide = [np.random.default_rng(1).normal(size=(1, 25)) for _ in range(3)]
  for w, x in zip(wide, (rewards, values, log_ratio)):
    w[0, positions] = x[0]
  got_spread, _ = vtrace.vtrace_returns(*wide, spread, 0.9, 0.7)
  np.testing.assert_allclose(np.asarray(got_spread)[0, positions], np.asarray(got_dense)[0], rtol=1e-5, atol=1e-6)
  assert np.all(np.asarray(got_spread)[0, ~spread[0]] == 0.0)


def test_bad_arguments_name_the_problem():
  rewards, values, log_ratio, mask = _inputs(0)
  with pytest.raises(ValueError, match="rho_bar"):
    vtrace.vtrace_returns(rewards, values, log_ratio, mask, 1.0, 1.0, 0.0, 1.0)
  with pytest.raises(ValueError, match="lam"):
    vtrace.vtrace_returns(rewards, values, log_ratio, mask, 1.0, 1.5)
  with pytest.raises(ValueError, match="log_ratio"):
    vtrace.vtrace_returns(rewards, values, log_ratio[:, :-1], mask, 1.0, 1.0)
