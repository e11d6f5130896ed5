"""GAE's "chunked" method at its edges (sao.core.gae_chunked), against the float64 loop of tests/core/reference.py."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sao.core import advantages as adv_lib
from sao.core import gae_chunked
from tests.core import reference as ref
from tests.core.test_advantages import agent_mask

_kernel_both = jax.jit(gae_chunked.advantages_and_returns, static_argnames=("rows", "chunk"))


def _kernel(rewards, values, mask, gamma, gamma_lam, rows, chunk=gae_chunked.CHUNK):
  """Advantages from the kernel, after checking its returns are `m·(A + V)`."""
  adv, ret = _kernel_both(rewards, values, mask, gamma, gamma_lam, rows=rows, chunk=chunk)
  np.testing.assert_allclose(ret, np.where(mask, np.asarray(adv) + values, 0.0), rtol=1e-6, atol=1e-6)
  return adv


_gae = jax.jit(adv_lib.gae, static_argnames="method")
_kernel_moments = jax.jit(gae_chunked.advantages_returns_and_moments, static_argnames=("rows", "chunk"))
_whitened = jax.jit(adv_lib.whitened_gae, static_argnames="method")


def edge_rows(seed, num_tokens=75):
  """Rows: no action, all actions, one action mid-row, one at the end, one at the start, agent-shaped, dense."""
  rng = np.random.default_rng(seed)
  mask = np.zeros((7, num_tokens), bool)
  mask[1] = True
  mask[2, num_tokens // 2] = True
  mask[3, -1] = True
  mask[4, 0] = True
  mask[5] = agent_mask(rng, 1, num_tokens)[0]
  mask[6] = rng.random(num_tokens) < 0.5
  rewards = rng.normal(size=mask.shape).astype(np.float32)
  values = rng.normal(size=mask.shape).astype(np.float32)
  return rewards, values, mask


def assert_matches_reference(got_adv, rewards, values, mask, gamma, lam, rtol=1e-5, atol=1e-5):
  want_adv, _ = ref.gae(rewards, values, mask, gamma, lam)
  np.testing.assert_allclose(got_adv, want_adv, rtol=rtol, atol=atol)
  assert not np.any(np.asarray(got_adv)[~mask])


def test_fits_says_when_the_factored_weights_are_exact():
  mask = np.array([[1, 0], [0, 0], [0, 1]], bool)
  g_min = gae_chunked.G_MIN
  fits = lambda g: bool(gae_chunked.fits(jnp.asarray(g, jnp.float32), mask))
  assert fits([0.5, 0.0, 1.0])  # the row without an action token may have any g
  assert fits([g_min, 0.0, 1.0 / g_min])
  assert not fits([0.0, 0.5, 0.5])  # λ = 0
  assert not fits([0.5, 0.5, g_min * 0.99])
  assert not fits([1.0 / g_min * 1.01, 0.5, 0.5])
  # 16-token chunks (the earlier default) take γλ down to 2^-8.
  assert gae_chunked.min_gamma_lambda(16) == 2.0 ** -8 and g_min == gae_chunked.min_gamma_lambda() == 1 / 16
  assert bool(gae_chunked.fits(jnp.asarray([0.01, 0.0, 1.0]), mask, chunk=16))
  assert not fits([0.01, 0.0, 1.0])


# Per-row λ (γ = 0.9): all inside the fast range, one λ near 1, the smallest λ the fast path takes, and rows that
# send the batch to the scan (λ = 0, λ just below the range).
_G_MIN_LAM = gae_chunked.G_MIN / 0.9
_LAMS = {
    "moderate": [0.0, 0.95, 0.7, 0.3, 0.5, 0.99, 0.8],
    "near_one": [1.0, 1.0 - 1e-6, 1.0, 1.0 - 1e-3, 0.999, 1.0, 1.0 - 1e-6],
    "near_range_edge": [0.2, _G_MIN_LAM * 1.001, _G_MIN_LAM * 1.1, _G_MIN_LAM * 1.5, _G_MIN_LAM * 3, _G_MIN_LAM * 1.001,
                        _G_MIN_LAM * 2],
    "lambda_zero": [0.5, 0.0, 0.9, 0.0, 0.3, 0.0, 0.7],
    "below_range": [0.5, _G_MIN_LAM * 0.5, 0.9, 1e-3, 0.3, 0.6, 0.7],
}


@pytest.mark.parametrize("lams", list(_LAMS))
@pytest.mark.parametrize("seed", [0, 1])
def test_edge_rows_match_float64_loop(lams, seed):
  rewards, values, mask = edge_rows(seed)
  gamma = 0.9
  lam = np.asarray(_LAMS[lams], np.float32)
  gamma_lam = jnp.asarray(gamma * lam, jnp.float32)
  fast = bool(gae_chunked.fits(gamma_lam, mask))
  assert fast == (lams not in ("lambda_zero", "below_range"))
  advantages, returns = _gae(rewards, values, mask, gamma, lam, method="chunked")
  assert_matches_reference(advantages, rewards, values, mask, gamma, lam)
  _, want_returns = ref.gae(rewards, values, mask, gamma, lam)
  np.testing.assert_allclose(returns, want_returns, rtol=1e-5, atol=1e-5)
  if fast:
    # The kernel itself, one row per group and the whole batch in one group (75 tokens: the last chunk padded), with
    # the default 32-token chunks and the earlier 16.
    for rows, chunk in ((1, 32), (7, 32), (7, 16)):
      got = _kernel(rewards, values, mask, jnp.float32(gamma), gamma_lam, rows=rows, chunk=chunk)
      assert_matches_reference(got, rewards, values, mask, gamma, lam)


@pytest.mark.parametrize("gamma", [1.0, 0.99, 0.5])
def test_long_runs_of_actions_stress_the_scale_factors(gamma):
  # Every chunk full of action tokens makes the factors reach g^{±CHUNK/2}; large |e| checks nothing overflows.
  rng = np.random.default_rng(3)
  rewards = (rng.normal(size=(3, 64)) * 1e4).astype(np.float32)
  values = (rng.normal(size=(3, 64)) * 1e4).astype(np.float32)
  mask = np.ones((3, 64), bool)
  mask[1, 5:40] = False
  lam = np.asarray([1.0, gae_chunked.G_MIN / gamma * 1.01, 0.5], np.float32)
  assert bool(gae_chunked.fits(jnp.asarray(gamma * lam), mask))
  for rows in (1, 3):
    got = _kernel(rewards, values, mask, jnp.float32(gamma), jnp.asarray(gamma * lam, jnp.float32), rows=rows)
    assert_matches_reference(got, rewards, values, mask, gamma, lam, rtol=1e-5, atol=1e-5 * 1e4)


@pytest.mark.parametrize("num_tokens", [16384, 131072])
def test_long_sequences(num_tokens):
  # Agent-shaped rows at γ = 1 with λ = 1, 1 − 1e-6 and VAPO's length-adaptive λ: the boundary state is carried
  # through thousands of chunks. Every method's error is the float32 rounding of sums of ~T terms (measured: 6e-6 at
  # T = 16384 and 4.4e-5 at 131072 for "chunked", "scan" and "associative" alike), bounded by ε·√T·scale with margin.
  rng = np.random.default_rng(num_tokens)
  mask = np.zeros((3, num_tokens), bool)
  for b in range(3):
    t = 0
    while t < num_tokens:
      n = int(rng.integers(1, 300))
      mask[b, t:t + n] = True
      t += n + int(rng.integers(1, 500))
  rewards = (rng.normal(size=mask.shape) * 0.01).astype(np.float32)
  rewards[:, -1000] += 1.0
  values = rng.random(mask.shape).astype(np.float32)
  lam = np.asarray([1.0, 1.0 - 1e-6, float(adv_lib.length_adaptive_lambda(mask[2:])[0])], np.float32)
  advantages, _ = _gae(rewards, values, mask, 1.0, lam, method="chunked")
  want, _ = ref.gae(rewards, values, mask, 1.0, lam)
  scale = np.max(np.abs(want))
  bound = 4 * np.finfo(np.float32).eps * np.sqrt(num_tokens) * scale
  np.testing.assert_allclose(advantages, want, rtol=0, atol=bound)


def random_rows(rng, num_tokens):
  """Rows of every kind the kernel must bridge: padding (no action, zero inputs), all observations (no action, nonzero
  inputs), all actions, one action token, single-token action runs, random densities, agent-shaped runs."""
  masks = [np.zeros(num_tokens, bool), np.zeros(num_tokens, bool), np.ones(num_tokens, bool),
           np.arange(num_tokens) == rng.integers(num_tokens), np.arange(num_tokens) % 2 == 1]
  masks += [rng.random(num_tokens) < p for p in rng.uniform(0.02, 0.98, size=5)]
  masks += list(agent_mask(rng, 2, num_tokens))
  mask = np.stack(masks)
  rewards = rng.normal(size=mask.shape).astype(np.float32)
  values = rng.normal(size=mask.shape).astype(np.float32)
  rewards[0] = values[0] = 0.0
  return rewards, values, mask


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_masks_match_float64_loop_and_the_16_token_kernel(seed):
  # γλ per row spans the fast range: at its lower edge, tiny-but-inside, moderate, near 1 and exactly 1. T = 203 is
  # 7 chunks of 32 (the last padded) or 13 of 16, so the chunk boundaries fall at different tokens for the two kernels.
  rng = np.random.default_rng(seed)
  rewards, values, mask = random_rows(rng, 203)
  gamma = float(rng.choice([1.0, 0.99, 0.9]))
  g_min = gae_chunked.G_MIN
  gamma_lam = np.asarray([0.5, 0.0, g_min * 1.0001, g_min * 1.5, 0.3, 0.7, 0.95, 1.0 - 1e-6, 1.0, g_min * 4, 0.999,
                          gamma, 0.8], np.float32)[:len(mask)]
  lam = gamma_lam / np.float32(gamma)
  assert bool(gae_chunked.fits(jnp.asarray(gamma_lam), mask))  # the λ = 0 row has no action token
  got = {}
  for chunk in (32, 16):
    for rows in (1, len(mask)):
      got[chunk, rows] = _kernel(rewards, values, mask, jnp.float32(gamma), jnp.asarray(gamma_lam), rows, chunk)
      assert_matches_reference(got[chunk, rows], rewards, values, mask, gamma, lam)
  # The earlier kernel as a second oracle: the same float32 sums in another order.
  np.testing.assert_allclose(got[32, 1], got[16, len(mask)], rtol=1e-5, atol=1e-5)
  # Through gae(): the same rows with λ = 0 on three of them send the batch to the scan, still exact.
  lam_zero = lam.copy()
  lam_zero[[3, 5, 8]] = 0.0
  advantages, returns = _gae(rewards, values, mask, gamma, lam_zero, method="chunked")
  assert_matches_reference(advantages, rewards, values, mask, gamma, lam_zero)
  np.testing.assert_allclose(returns, ref.gae(rewards, values, mask, gamma, lam_zero)[1], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("num_tokens", [1])
def test_short_sequences(num_tokens):
  # One token: a chunk that is all padding but one; a row of each kind.
  rng = np.random.default_rng(num_tokens)
  rewards, values, mask = random_rows(rng, num_tokens)
  lam = np.linspace(0.2, 1.0, len(mask)).astype(np.float32)
  advantages, returns = _gae(rewards, values, mask, 0.95, lam, method="chunked")
  assert_matches_reference(advantages, rewards, values, mask, 0.95, lam)
  np.testing.assert_allclose(returns, ref.gae(rewards, values, mask, 0.95, lam)[1], rtol=1e-5, atol=1e-5)
  whitened, _ = _whitened(rewards, values, mask, 0.95, lam, method="chunked")
  want = ref.masked_whiten(ref.gae(rewards, values, mask, 0.95, lam)[0], mask)
  np.testing.assert_allclose(whitened, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("chunk", [0, 12, 64, True, 16.0])
def test_chunk_must_be_a_supported_length(chunk):
  x = np.zeros((2, 40), np.float32)
  with pytest.raises(ValueError, match="chunk"):
    gae_chunked.advantages_and_returns(x, x, x > 0, jnp.float32(1.0), jnp.ones((2,)), chunk=chunk)


@pytest.mark.parametrize("rows", [0, 4, 2.0])
def test_rows_must_divide_the_batch(rows):
  x = np.zeros((6, 40), np.float32)
  with pytest.raises(ValueError, match="rows"):
    gae_chunked.advantages_and_returns(x, x, x > 0, jnp.float32(1.0), jnp.ones((6,)), rows=rows)


@pytest.mark.parametrize(("batch", "num_tokens", "want"), [(256, 16384, 32), (64, 4096, 64), (7, 75, 7),
                                                             (6, 1 << 18, 2), (5, 1 << 22, 1), (96, 16384, 32)])
def test_group_rows_is_the_largest_divisor_within_the_group_size(batch, num_tokens, want):
  assert gae_chunked.group_rows(batch, num_tokens) == want


def test_vmap_and_grad_with_lambda_zero_stay_finite():
  # Under vmap the lax.cond in gae() becomes a select that computes the chunked branch too, with g = 0 where it does
  # not fit; the result and its gradient must still be the scan's, finite.
  rewards, values, mask = edge_rows(4, num_tokens=20)

  def total(values, method):
    per_row = jax.vmap(lambda r, v, m: adv_lib.gae(r[None], v[None], m[None], 0.9, 0.0, method=method)[0][0])
    return per_row(rewards, values, mask).sum()

  got = jax.grad(total)(values, "chunked")
  assert np.all(np.isfinite(got))
  np.testing.assert_allclose(got, jax.grad(total)(values, "scan"), rtol=1e-6, atol=1e-6)




def reference_moments(advantages, mask):
  selected = np.asarray(advantages, np.float64)[mask]
  mean = selected.mean() if selected.size else 0.0
  return selected.size, mean, np.sum((selected - mean) ** 2)


@pytest.mark.parametrize("rows", [1, 2, 5, 10])
def test_moments_from_the_gae_pass_match_float64(rows):
  # Edge rows (no action, all actions, single actions at the ends) and random masks; groups of 1, 2 and 5 rows
  # merge per-group moments (some groups have no action token), 10 puts the whole batch in one group.
  rewards, values, mask = edge_rows(5, num_tokens=75)
  rng = np.random.default_rng(6)
  mask = np.concatenate([mask, rng.random((3, 75)) < rng.random((3, 1))])
  rewards = np.concatenate([rewards, rng.normal(size=(3, 75)).astype(np.float32)])
  values = np.concatenate([values, rng.normal(size=(3, 75)).astype(np.float32)])
  gamma, lam = 0.95, rng.uniform(0.3, 1.0, size=10).astype(np.float32)
  adv, ret, (count, mean, sum_sq) = _kernel_moments(rewards, values, mask, jnp.float32(gamma),
                                                    jnp.asarray(gamma * lam, jnp.float32), rows=rows)
  assert_matches_reference(adv, rewards, values, mask, gamma, lam)
  want_count, want_mean, want_sum_sq = reference_moments(ref.gae(rewards, values, mask, gamma, lam)[0], mask)
  assert float(count) == want_count
  np.testing.assert_allclose(mean, want_mean, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(sum_sq, want_sum_sq, rtol=1e-5)


def test_moments_stay_accurate_when_the_mean_dwarfs_the_spread():
  # Advantages ≈ 1067 (1000 on each row's last action token) ± 1, γλ at the fast range's lower edge: a sequential
  # one-pass Σ A² − (Σ A)²/n in float32 gives M2 = 18112 here instead of 18316; the per-group centring and Chan's
  # merge keep it to the rounding of the centred terms.
  rng = np.random.default_rng(7)
  mask = rng.random((4, 200)) < 0.7
  rewards = (1000.0 + rng.normal(size=mask.shape)).astype(np.float32)
  values = np.zeros(mask.shape, np.float32)
  gamma, lam = 0.5, np.full(4, gae_chunked.G_MIN / 0.5 * 1.01, np.float32)
  _, _, (count, mean, sum_sq) = _kernel_moments(rewards, values, mask, jnp.float32(gamma),
                                                jnp.asarray(gamma * lam, jnp.float32), rows=1)
  want_count, want_mean, want_sum_sq = reference_moments(ref.gae(rewards, values, mask, gamma, lam)[0], mask)
  assert float(count) == want_count
  np.testing.assert_allclose(mean, want_mean, rtol=1e-6)
  np.testing.assert_allclose(sum_sq, want_sum_sq, rtol=1e-3)


def test_moments_of_an_empty_mask_are_zero():
  x = np.ones((3, 40), np.float32)
  _, _, moments = _kernel_moments(x, x, x < 0, jnp.float32(1.0), jnp.full((3,), 0.9), rows=1)
  assert [float(v) for v in moments] == [0.0, 0.0, 0.0]


@pytest.mark.parametrize("lams", ["moderate", "near_range_edge", "lambda_zero"])
def test_whitened_gae_matches_float64_whitening_of_the_loop(lams):
  # "chunked" fuses the moments into the GAE pass when the batch fits and falls back to scan + masked_whiten when
  # it does not (λ = 0 rows); both must equal the float64 loop followed by float64 whitening.
  rewards, values, mask = edge_rows(8)
  gamma, lam = 0.9, np.asarray(_LAMS[lams], np.float32)
  assert bool(gae_chunked.fits(jnp.asarray(gamma * lam), mask)) == (lams != "lambda_zero")
  whitened, returns = _whitened(rewards, values, mask, gamma, lam, method="chunked")
  want_adv, want_ret = ref.gae(rewards, values, mask, gamma, lam)
  np.testing.assert_allclose(whitened, ref.masked_whiten(want_adv, mask), rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(returns, want_ret, rtol=1e-5, atol=1e-5)
  assert not np.any(np.asarray(whitened)[~mask]) and not np.any(np.asarray(returns)[~mask])


def test_whitened_gae_gradient_equals_the_unfused_pipeline():
  # The fused moments are differentiated through the row-group scan; the gradient with respect to the values must be
  # the one of gae(method="scan") followed by masked_whiten.
  rewards, values, mask = edge_rows(9, num_tokens=40)
  weights = np.random.default_rng(9).normal(size=mask.shape).astype(np.float32)
  lam = np.asarray(_LAMS["moderate"], np.float32)

  def fused(values):
    whitened, returns = adv_lib.whitened_gae(rewards, values, mask, 0.9, lam)
    return jnp.sum(weights * whitened) + jnp.sum(returns)

  def unfused(values):
    advantages, returns = adv_lib.gae(rewards, values, mask, 0.9, lam, method="scan")
    return jnp.sum(weights * adv_lib.masked_whiten(advantages, mask)) + jnp.sum(returns)

  np.testing.assert_allclose(jax.grad(fused)(values), jax.grad(unfused)(values), rtol=1e-4, atol=1e-4)
