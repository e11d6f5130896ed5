"""GAE's native CPU kernel (sao.kernels.gae_cpu) against the float64 loop of tests/core/reference.py."""
import platform

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sao.core import advantages as adv_lib
from sao.kernels import build, gae_cpu
from tests.core import reference as ref
from tests.core.test_gae_chunked import edge_rows, random_rows, reference_moments

pytestmark = pytest.mark.skipif(not gae_cpu.available(), reason="the native kernel does not build on this host")

_native = jax.jit(gae_cpu.advantages_returns_and_moments, static_argnames="with_returns")
_gae = jax.jit(adv_lib.gae, static_argnames="method")
_whitened = jax.jit(adv_lib.whitened_gae, static_argnames="method")


def _tolerance(want, num_tokens):
  """float32 rounding of a sum of up to `num_tokens` terms of the rows' scale."""
  return 8 * np.finfo(np.float32).eps * np.sqrt(max(num_tokens, 1)) * max(float(np.max(np.abs(want))), 1.0)


def check(rewards, values, mask, gamma, gamma_lam):
  """Runs the kernel; checks A, R and the per-row moments against float64; returns A."""
  gamma_lam = np.asarray(gamma_lam, np.float32)
  adv, ret, moments = _native(rewards, values, mask, jnp.float32(gamma), jnp.asarray(gamma_lam))
  lam = gamma_lam.astype(np.float64) / gamma if gamma else np.zeros(len(mask))
  want_adv, want_ret = ref.gae(rewards, values, mask, gamma, lam)
  atol = _tolerance(want_adv, mask.shape[-1])
  np.testing.assert_allclose(adv, want_adv, rtol=0, atol=atol)
  np.testing.assert_allclose(ret, want_ret, rtol=0, atol=atol + _tolerance(values, 1))
  assert not np.any(np.asarray(adv)[~mask]) and not np.any(np.asarray(ret)[~mask])
  for row in range(len(mask)):
    count, mean, m2 = reference_moments(want_adv[row], mask[row])
    np.testing.assert_allclose(moments[row], [count, mean, m2], rtol=1e-4, atol=atol * (1 + np.sqrt(count)))
  return adv


@pytest.mark.parametrize("num_tokens", [1, 3, 7, 8, 9, 16, 75, 203])
def test_edge_rows_at_every_length_around_the_vector_width(num_tokens):
  # Rows without an action token, all-action rows, one action at either end, agent-shaped and dense rows; lengths
  # below, at and past the kernel's 8-token vectors (its scalar tail is the last T % 8 tokens).
  rewards, values, mask = edge_rows(num_tokens, num_tokens=num_tokens)
  check(rewards, values, mask, 0.95, np.linspace(0.3, 0.98, len(mask)))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_masks_and_every_gamma_lambda(seed):
  # γλ = 0 (λ = 0), tiny (below the chunked kernel's range: no rescaling here, so still exact), moderate, 1 - 1e-6
  # and exactly 1 (γ = λ = 1).
  rng = np.random.default_rng(seed)
  rewards, values, mask = random_rows(rng, 203)
  gamma = float(rng.choice([1.0, 0.99, 0.9]))
  gamma_lam = np.asarray([0.5, 0.0, 1e-3, 1e-6, 0.0, 0.3, 0.7, 0.95, 1.0 - 1e-6, gamma, 0.999, 0.05, 0.8])
  check(rewards, values, mask, gamma, gamma_lam[:len(mask)] * min(gamma, 1.0))


def test_gamma_zero_and_gamma_lambda_one():
  rewards, values, mask = edge_rows(3, num_tokens=41)
  check(rewards, values, mask, 0.0, np.zeros(len(mask)))
  check(rewards, values, mask, 1.0, np.ones(len(mask)))


def test_many_rows_are_split_over_threads():
  # 2^17 tokens: the kernel hands rows to XLA's intra-op pool (above 2^16 tokens); every row must be written once.
  rng = np.random.default_rng(4)
  mask = rng.random((64, 2048)) < rng.uniform(0.05, 0.95, size=(64, 1))
  rewards = rng.normal(size=mask.shape).astype(np.float32)
  values = rng.normal(size=mask.shape).astype(np.float32)
  check(rewards, values, mask, 0.99, rng.uniform(0.5, 1.0, size=64))


def test_without_returns_the_advantages_and_moments_are_the_same():
  rewards, values, mask = edge_rows(5, num_tokens=50)
  gamma_lam = jnp.full((len(mask),), 0.9)
  adv, ret, moments = _native(rewards, values, mask, jnp.float32(0.95), gamma_lam)
  adv_only, none, moments_only = _native(rewards, values, mask, jnp.float32(0.95), gamma_lam, with_returns=False)
  assert none is None and ret.shape == mask.shape
  np.testing.assert_array_equal(adv_only, adv)
  np.testing.assert_array_equal(moments_only, moments)


def test_leading_dims_and_vmap_are_rows():
  rewards, values, mask = edge_rows(6, num_tokens=30)
  gamma_lam = np.linspace(0.2, 0.9, len(mask)).astype(np.float32)
  flat = _native(rewards, values, mask, jnp.float32(0.9), gamma_lam)
  stacked = _native(rewards[None], values[None], mask[None], jnp.float32(0.9), gamma_lam[None])
  per_row = jax.vmap(lambda r, v, m, g: gae_cpu.advantages_returns_and_moments(r, v, m, 0.9, g))(
      rewards, values, mask, gamma_lam)
  for a, b, c in zip(flat, stacked, per_row):
    np.testing.assert_array_equal(b[0], a)
    np.testing.assert_array_equal(c, a)


def test_empty_batches_and_sequences():
  for shape in ((0, 16), (4, 0)):
    x = np.zeros(shape, np.float32)
    adv, ret, moments = _native(x, x, x > 0, jnp.float32(1.0), jnp.zeros(shape[:1]))
    assert adv.shape == ret.shape == shape and moments.shape == (shape[0], 3)
    assert not np.any(moments)


def test_bad_inputs_name_the_argument():
  x = jnp.zeros((2, 8), jnp.float32)
  with pytest.raises(ValueError, match="values must be float32"):
    gae_cpu.advantages_returns_and_moments(x, x.astype(jnp.bfloat16), x > 0, 1.0, jnp.ones(2))
  with pytest.raises(ValueError, match="mask must be bool"):
    gae_cpu.advantages_returns_and_moments(x, x, x, 1.0, jnp.ones(2))
  with pytest.raises(ValueError, match="gamma_lam must be"):
    gae_cpu.advantages_returns_and_moments(x, x, x > 0, 1.0, jnp.ones(3))


def test_merged_moments_match_float64_when_the_mean_dwarfs_the_spread():
  # Advantages ≈ 1000 ± 1: each row centres on its own mean, and Chan's merge adds the rows' offsets exactly.
  rng = np.random.default_rng(7)
  mask = rng.random((4, 200)) < 0.7
  rewards = (1000.0 + rng.normal(size=mask.shape)).astype(np.float32)
  values = np.zeros(mask.shape, np.float32)
  _, _, moments = _native(rewards, values, mask, jnp.float32(0.5), jnp.full((4,), 0.1))
  count, mean, m2 = gae_cpu.merge_row_moments(moments)
  want = reference_moments(ref.gae(rewards, values, mask, 0.5, 0.2)[0], mask)
  assert float(count) == want[0]
  np.testing.assert_allclose([mean, m2], want[1:], rtol=1e-4)


@pytest.mark.parametrize("lams", [[0.0, 0.5, 1.0, 0.9, 0.7, 0.01, 0.3], [0.9] * 7])
def test_gae_and_whitened_gae_choose_the_kernel_on_cpu(lams):
  # The default method is the native kernel here; gae and whitened_gae must equal the float64 loop and whitening,
  # with λ = 0 and λ far below the chunked kernel's range in the same batch.
  rewards, values, mask = edge_rows(8)
  lam = np.asarray(lams, np.float32)
  lowered = jax.jit(lambda: adv_lib.gae(rewards, values, mask, 0.9, lam)).lower().as_text()
  assert gae_cpu.TARGET in lowered
  want_adv, want_ret = ref.gae(rewards, values, mask, 0.9, lam)
  for method in ("auto", "native"):
    adv, ret = _gae(rewards, values, mask, 0.9, lam, method=method)
    np.testing.assert_allclose(adv, want_adv, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ret, want_ret, rtol=1e-5, atol=1e-5)
    whitened, ret = _whitened(rewards, values, mask, 0.9, lam, method=method)
    np.testing.assert_allclose(whitened, ref.masked_whiten(want_adv, mask), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(ret, want_ret, rtol=1e-5, atol=1e-5)


def test_other_platforms_and_float64_run_the_xla_formulation():
  rewards, values, mask = edge_rows(9, num_tokens=40)
  lam = np.full(len(mask), 0.9, np.float32)
  for_tpu = jax.jit(lambda r, v: adv_lib.whitened_gae(r, v, mask, 0.9, lam)).trace(rewards, values).lower(
      lowering_platforms=("tpu",)).as_text()
  assert gae_cpu.TARGET not in for_tpu
  with jax.enable_x64(True):
    lowered = jax.jit(lambda r, v: adv_lib.gae(r, v, mask, 0.9, lam)).lower(
        rewards.astype(np.float64), values.astype(np.float64)).as_text()
  assert gae_cpu.TARGET not in lowered


def test_gradient_is_the_xla_formulations():
  # The kernel has no derivative; whitened_gae's gradient through it must be the scan + masked_whiten pipeline's.
  rewards, values, mask = edge_rows(9, num_tokens=40)
  weights = np.random.default_rng(9).normal(size=mask.shape).astype(np.float32)
  lam = np.asarray([0.5, 0.0, 1.0, 0.9, 0.7, 0.01, 0.3], np.float32)

  def loss(values, method):
    if method == "scan":
      advantages, returns = adv_lib.gae(rewards, values, mask, 0.9, lam, method="scan")
      whitened = adv_lib.masked_whiten(advantages, mask)
    else:
      whitened, returns = adv_lib.whitened_gae(rewards, values, mask, 0.9, lam, method="native")
    return jnp.sum(weights * whitened) + jnp.sum(returns)

  np.testing.assert_allclose(jax.grad(loss)(values, "native"), jax.grad(loss)(values, "scan"), rtol=1e-4, atol=1e-4)


def test_sharded_batch_on_eight_devices_equals_one_device():
  # Under jit with the batch sharded over a mesh, XLA's partitioner gathers the custom call's operands; the result
  # must be the single-device one.
  mesh = jax.sharding.Mesh(np.array(jax.devices()), ("data",))
  rng = np.random.default_rng(11)
  mask = rng.random((16, 96)) < 0.6
  rewards = rng.normal(size=mask.shape).astype(np.float32)
  values = rng.normal(size=mask.shape).astype(np.float32)
  lam = rng.uniform(0.0, 1.0, size=16).astype(np.float32)
  sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
  args = [jax.device_put(x, sharding) for x in (rewards, values, mask)]
  fn = jax.jit(lambda r, v, m: adv_lib.whitened_gae(r, v, m, 0.95, lam))
  for got, want in zip(fn(*args), fn(rewards, values, mask)):
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_observation_tokens_never_leak_their_inputs():
  # Rewards and values on observation tokens are ignored: NaN and inf there must not reach any output.
  rewards, values, mask = edge_rows(12, num_tokens=37)
  dirty_r, dirty_v = rewards.copy(), values.copy()
  dirty_r[~mask], dirty_v[~mask] = np.nan, np.inf
  gamma_lam = jnp.full((len(mask),), 0.9)
  clean = _native(rewards * mask, values * mask, mask, jnp.float32(0.95), gamma_lam)
  dirty = _native(dirty_r, dirty_v, mask, jnp.float32(0.95), gamma_lam)
  for got, want in zip(dirty, clean):
    np.testing.assert_array_equal(got, want)


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="x86 compiler flags")
def test_the_portable_mask_load_equals_the_avx2_one():
  # Without AVX2 the kernel converts the mask bytes with portable vector code; built that way (-mno-avx2) and
  # registered under a target of its own, it must give the same bits as the default build.
  target = "sao_gae_f32_portable"
  build.load(gae_cpu.NAME, {target: "SaoGaeF32"}, extra_flags=("-mno-avx2",))
  rng = np.random.default_rng(13)
  rewards, values, mask = random_rows(rng, 203)
  gamma, gamma_lam = np.full(len(mask), 0.95, np.float32), np.linspace(0.0, 0.95, len(mask)).astype(np.float32)
  shapes = (jax.ShapeDtypeStruct(mask.shape, jnp.float32),) * 2 + (jax.ShapeDtypeStruct((len(mask), 3), jnp.float32),)
  portable = jax.ffi.ffi_call(target, shapes)(rewards, values, mask, gamma, gamma_lam)
  default = jax.ffi.ffi_call(gae_cpu.TARGET, shapes)(rewards, values, mask, gamma, gamma_lam)
  for got, want in zip(portable, default):
    np.testing.assert_array_equal(got, want)
  check(rewards, values, mask, 0.95, gamma_lam)
