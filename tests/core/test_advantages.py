"""sao.core.advantages against float64 NumPy loops, on random inputs with agent-shaped random masks."""
import hypothesis
import hypothesis.extra.numpy as hnp
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sao.core import advantages as adv_lib
from sao.core import gae_chunked
from tests.core import reference as ref

METHODS = ["chunked", "scan", "associative"]


def agent_mask(rng, batch, num_tokens):
  """Masks shaped like agent trajectories: turns of actions separated by observation runs, plus edge rows."""
  mask = np.zeros((batch, num_tokens), bool)
  for b in range(batch):
    t = int(rng.integers(0, 4))  # prompt
    while t < num_tokens:
      n_act = int(rng.integers(1, 6))
      mask[b, t:t + n_act] = True
      t += n_act + int(rng.integers(0, 12))  # observation run, sometimes long
  if batch >= 3:
    mask[0] = False  # a row with no action token
    mask[1, :2] = False  # starts with observations
    mask[1, -3:] = False  # ends with observations
    mask[2, -1] = True  # ends on an action
  return mask


def random_inputs(seed, batch=6, num_tokens=37):
  rng = np.random.default_rng(seed)
  rewards = rng.normal(size=(batch, num_tokens)).astype(np.float32)
  values = rng.normal(size=(batch, num_tokens)).astype(np.float32)
  return rewards, values, agent_mask(rng, batch, num_tokens), rng


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (0.99, 0.95), (0.9, "per_sequence"), (0.5, 0.0)])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gae_matches_float64_loop(method, gamma, lam, seed):
  rewards, values, mask, rng = random_inputs(seed)
  if lam == "per_sequence":
    lam = rng.uniform(0.0, 1.0, size=rewards.shape[0]).astype(np.float32)
  advantages, returns = jax.jit(adv_lib.gae, static_argnames="method")(rewards, values, mask, gamma, lam,
                                                                        method=method)
  want_adv, want_ret = ref.gae(rewards, values, mask, gamma, lam)
  np.testing.assert_allclose(advantages, want_adv, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(returns, want_ret, rtol=1e-5, atol=1e-5)
  assert advantages.dtype == jnp.float32
  assert not np.any(np.asarray(advantages)[~mask]) and not np.any(np.asarray(returns)[~mask])


def test_gae_float64_exact_under_x64():
  rewards, values, mask, _ = random_inputs(3, batch=4, num_tokens=50)
  with jax.enable_x64(True):
    for method in METHODS:
      a, r = adv_lib.gae(rewards.astype(np.float64), values.astype(np.float64), mask, 0.97, 0.9, method=method)
      assert a.dtype == jnp.float64
      want_a, want_r = ref.gae(rewards, values, mask, 0.97, 0.9)
      np.testing.assert_allclose(a, want_a, rtol=1e-12, atol=1e-12)
      np.testing.assert_allclose(r, want_r, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("shape", [(1, 1), (1, 9), (5, 1), (0, 4), (3, 0)])
def test_gae_edge_shapes(shape):
  rng = np.random.default_rng(4)
  rewards = rng.normal(size=shape).astype(np.float32)
  values = rng.normal(size=shape).astype(np.float32)
  mask = rng.random(shape) < 0.5
  for method in METHODS:
    a, r = adv_lib.gae(rewards, values, mask, 0.9, 0.7, method=method)
    want_a, want_r = ref.gae(rewards, values, mask, 0.9, 0.7)
    np.testing.assert_allclose(a, want_a, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(r, want_r, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("method", METHODS)
def test_gae_bridges_observations_and_is_monte_carlo_at_gamma_lambda_one(method):
  # Terminal reward on the last action token, γ = λ = 1: every action token's return is the outcome reward,
  # however long the observation runs between turns.
  mask = np.array([[0, 1, 1, 0, 0, 0, 1, 0, 0]], bool)
  token_rewards, _ = adv_lib.place_terminal_reward(jnp.array([1.0]), mask)
  values = np.linspace(0.1, 0.9, 9, dtype=np.float32)[None]
  a, r = adv_lib.gae(token_rewards, values, mask, 1.0, 1.0, method=method)
  np.testing.assert_allclose(np.asarray(r)[mask], 1.0, rtol=1e-6)
  np.testing.assert_allclose(np.asarray(a)[mask], 1.0 - values[mask], rtol=1e-6)


@pytest.mark.parametrize("method", METHODS)
def test_gae_bfloat16_inputs_compute_in_float32(method):
  rewards, values, mask, _ = random_inputs(5)
  a, r = adv_lib.gae(jnp.asarray(rewards, jnp.bfloat16), jnp.asarray(values, jnp.bfloat16), mask, 0.99, 0.95,
                     method=method)
  assert a.dtype == jnp.float32 and r.dtype == jnp.float32
  want_a, _ = ref.gae(np.asarray(jnp.asarray(rewards, jnp.bfloat16), np.float64),
                      np.asarray(jnp.asarray(values, jnp.bfloat16), np.float64), mask, 0.99, 0.95)
  np.testing.assert_allclose(a, want_a, rtol=1e-4, atol=1e-4)


# jit caches one compile per (shape, method); γ and λ are traced, so hypothesis' values cost no recompiles.
_jitted_gae = jax.jit(adv_lib.gae, static_argnames="method")


@hypothesis.settings(deadline=None, max_examples=40)
@hypothesis.given(
    data=st.data(),
    # A few shapes only: every new shape is a fresh XLA compile, and the values are what hypothesis should explore.
    batch=st.sampled_from([1, 3]),
    num_tokens=st.sampled_from([1, 7, 24]),
    gamma=st.floats(0.5, 1.0),
    lam=st.floats(0.0, 1.0),
)
def test_gae_property_methods_equal_loop(data, batch, num_tokens, gamma, lam):
  floats = st.floats(-10, 10, width=32)
  rewards = data.draw(hnp.arrays(np.float32, (batch, num_tokens), elements=floats))
  values = data.draw(hnp.arrays(np.float32, (batch, num_tokens), elements=floats))
  mask = data.draw(hnp.arrays(np.bool_, (batch, num_tokens)))
  a_scan, r_scan = _jitted_gae(rewards, values, mask, gamma, lam, method="scan")
  a_assoc, r_assoc = _jitted_gae(rewards, values, mask, gamma, lam, method="associative")
  a_chunk, r_chunk = _jitted_gae(rewards, values, mask, gamma, lam, method="chunked")
  want_a, want_r = ref.gae(rewards, values, mask, gamma, lam)
  np.testing.assert_allclose(a_scan, want_a, rtol=1e-5, atol=1e-4)
  np.testing.assert_allclose(a_assoc, a_scan, rtol=1e-5, atol=1e-4)
  np.testing.assert_allclose(r_assoc, r_scan, rtol=1e-5, atol=1e-4)
  np.testing.assert_allclose(a_chunk, want_a, rtol=1e-5, atol=1e-4)
  np.testing.assert_allclose(r_chunk, want_r, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("shape", [(6, 37), (1, 1), (5, 1), (0, 4), (3, 0)])
def test_whitened_gae_matches_float64_loop_then_whitening(shape):
  # Agent-shaped masks with an empty row (6x37, every method) and the degenerate shapes (length-1 rows, no rows,
  # no tokens; "chunked", the one with its own code path). Per-sequence λ up to 1, inside the fused path's range;
  # λ = 0 and its fallback are in tests/core/test_gae_chunked.py.
  rng = np.random.default_rng(10)
  rewards = rng.normal(size=shape).astype(np.float32)
  values = rng.normal(size=shape).astype(np.float32)
  mask = agent_mask(rng, *shape) if shape[1] else np.zeros(shape, bool)
  lam = rng.choice([0.5, 0.95, 1.0], size=shape[0]).astype(np.float32)
  want_adv, want_ret = ref.gae(rewards, values, mask, 0.97, lam)
  for method in METHODS if shape == (6, 37) else ["chunked"]:
    whitened, returns = adv_lib.whitened_gae(rewards, values, mask, 0.97, lam, method=method)
    np.testing.assert_allclose(whitened, ref.masked_whiten(want_adv, mask), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(returns, want_ret, rtol=1e-5, atol=1e-5)


def test_length_adaptive_lambda():
  rng = np.random.default_rng(6)
  mask = agent_mask(rng, 6, 40)
  for alpha in (1.5, 0.5, 3.0):
    got = adv_lib.length_adaptive_lambda(mask, alpha)
    np.testing.assert_allclose(got, ref.length_adaptive_lambda(mask, alpha), rtol=1e-6)
  assert float(adv_lib.length_adaptive_lambda(np.zeros((1, 5), bool))[0]) == 0.0
  np.testing.assert_allclose(adv_lib.length_adaptive_lambda(np.ones((1, 100), bool)), [1 - 1 / 150], rtol=1e-6)


def test_place_terminal_reward():
  rng = np.random.default_rng(7)
  mask = agent_mask(rng, 6, 30)
  rewards = rng.normal(size=6).astype(np.float32)
  got, has_action = adv_lib.place_terminal_reward(rewards, mask)
  want, want_has = ref.place_terminal_reward(rewards, mask)
  np.testing.assert_allclose(got, want, rtol=1e-6)
  np.testing.assert_array_equal(has_action, want_has)
  assert not want_has[0] and not np.any(np.asarray(got)[0])


@pytest.mark.parametrize("seed", [0, 1])
def test_masked_statistics(seed):
  rng = np.random.default_rng(seed)
  x = rng.normal(3.0, 2.0, size=(5, 33)).astype(np.float32)
  mask = agent_mask(rng, 5, 33)
  np.testing.assert_allclose(adv_lib.masked_mean(x, mask), ref.masked_mean(x, mask), rtol=1e-5)
  np.testing.assert_allclose(adv_lib.masked_var(x, mask), ref.masked_var(x, mask), rtol=1e-5)
  np.testing.assert_allclose(adv_lib.masked_var(x, mask, unbiased=True), ref.masked_var(x, mask, True), rtol=1e-5)
  whitened = adv_lib.masked_whiten(x, mask)
  np.testing.assert_allclose(whitened, ref.masked_whiten(x, mask), rtol=1e-4, atol=1e-5)
  assert abs(float(adv_lib.masked_mean(whitened, mask))) < 1e-5
  np.testing.assert_allclose(adv_lib.masked_var(whitened, mask), 1.0, rtol=1e-4)
  assert not np.any(np.asarray(whitened)[~mask])
  bf16 = adv_lib.masked_whiten(jnp.asarray(x, jnp.bfloat16), mask)
  assert bf16.dtype == jnp.float32


def test_masked_statistics_empty_mask():
  x = np.ones((2, 3), np.float32)
  empty = np.zeros((2, 3), bool)
  assert float(adv_lib.masked_mean(x, empty)) == 0.0
  assert float(adv_lib.masked_var(x, empty)) == 0.0
  assert not np.any(np.asarray(adv_lib.masked_whiten(x, empty)))


@hypothesis.settings(deadline=None, max_examples=30)
@hypothesis.given(
    rewards=hnp.arrays(np.float32, st.sampled_from([1, 2, 5, 12]), elements=st.floats(-5, 5, width=32)),
    num_groups=st.integers(1, 4),
    normalize_std=st.booleans(),
    seed=st.integers(0, 1000),
)
def test_group_advantages(rewards, num_groups, normalize_std, seed):
  group_ids = np.random.default_rng(seed).integers(0, num_groups, size=rewards.shape[0])
  got = adv_lib.group_advantages(rewards, group_ids, normalize_std=normalize_std)
  want = ref.group_advantages(rewards, group_ids, normalize_std=normalize_std)
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_group_of_one_gets_zero():
  got = adv_lib.group_advantages(np.array([1.0, 0.0, 1.0, 7.0], np.float32), np.array([3, 3, 3, 9]))
  assert float(got[3]) == 0.0
  assert float(got[0]) > 0 > float(got[1])


def test_bad_inputs_name_the_argument():
  r = np.zeros((2, 5), np.float32)
  m = np.ones((2, 5), bool)
  with pytest.raises(ValueError, match="values"):
    adv_lib.gae(r, np.zeros((2, 4), np.float32), m, 1.0, 1.0)
  with pytest.raises(ValueError, match="action_mask"):
    adv_lib.gae(r, r, m.astype(np.float32), 1.0, 1.0)
  with pytest.raises(ValueError, match="action_mask"):
    adv_lib.gae(r, r, np.ones((2, 6), bool), 1.0, 1.0)
  with pytest.raises(ValueError, match="rewards"):
    adv_lib.gae(r.astype(np.int32), r, m, 1.0, 1.0)
  with pytest.raises(ValueError, match="lam"):
    adv_lib.gae(r, r, m, 1.0, np.ones(3, np.float32))
  with pytest.raises(ValueError, match="method"):
    adv_lib.gae(r, r, m, 1.0, 1.0, method="loop")
  with pytest.raises(ValueError, match="mask"):
    adv_lib.masked_whiten(r, np.ones((2, 5), np.float32))
  with pytest.raises(ValueError, match="group_ids"):
    adv_lib.group_advantages(np.zeros(3, np.float32), np.zeros(3, np.float32))
  # Raised at trace time under jit, too.
  with pytest.raises(ValueError, match="action_mask"):
    jax.jit(adv_lib.gae)(r, r, m.astype(np.float32), 1.0, 1.0)


@pytest.mark.parametrize("num_tokens", [1, 3, 4, 8, 203, 4096])
def test_length_adaptive_lambda_counts_exactly_on_both_count_paths(num_tokens):
  # T a multiple of 4 counts 4 mask bytes per popcount on the CPU; the other lengths take the float32 sum. Rows of
  # every density, empty and full ones included.
  rng = np.random.default_rng(num_tokens)
  mask = rng.random((9, num_tokens)) < np.linspace(0.0, 1.0, 9)[:, None]
  np.testing.assert_array_equal(jax.jit(adv_lib._action_counts)(mask), mask.sum(-1))  # pylint: disable=protected-access
  got = jax.jit(adv_lib.length_adaptive_lambda)(mask)
  np.testing.assert_allclose(got, ref.length_adaptive_lambda(mask, 1.5), rtol=1e-6)
  for_tpu = jax.jit(adv_lib.length_adaptive_lambda).trace(mask).lower(lowering_platforms=("tpu",)).as_text()
  assert "popcnt" not in for_tpu
  assert ("popcnt" in jax.jit(adv_lib.length_adaptive_lambda).lower(mask).as_text()) == (num_tokens % 4 == 0)
