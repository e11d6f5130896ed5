"""Whitening and GAE under jit with inputs sharded over a (data=8) mesh equal the unsharded results."""
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from sao.core import advantages as adv_lib
from tests.core.test_advantages import agent_mask


def test_sharded_whitening_uses_global_statistics():
  assert jax.device_count() == 8
  mesh = Mesh(np.array(jax.devices()), ("data",))
  rng = np.random.default_rng(0)
  # Shards with very different scales: a per-shard whitening would give a visibly different answer.
  x = (rng.normal(size=(16, 24)) * np.repeat(np.arange(1, 9), 2)[:, None] + np.arange(16)[:, None]).astype(np.float32)
  mask = agent_mask(rng, 16, 24)
  sharding = NamedSharding(mesh, P("data"))
  x_sharded, mask_sharded = jax.device_put(x, sharding), jax.device_put(mask, sharding)
  assert len(x_sharded.sharding.device_set) == 8
  whiten = jax.jit(adv_lib.masked_whiten, out_shardings=sharding)
  got = whiten(x_sharded, mask_sharded)
  want = adv_lib.masked_whiten(x, mask)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(jax.jit(adv_lib.masked_mean)(x_sharded, mask_sharded), x[mask].mean(), rtol=1e-5)


def test_sharded_gae_equals_unsharded():
  mesh = Mesh(np.array(jax.devices()), ("data",))
  rng = np.random.default_rng(1)
  rewards = rng.normal(size=(8, 40)).astype(np.float32)
  values = rng.normal(size=(8, 40)).astype(np.float32)
  mask = agent_mask(rng, 8, 40)
  lam = adv_lib.length_adaptive_lambda(mask)
  sharding = NamedSharding(mesh, P("data"))
  args = [jax.device_put(a, sharding) for a in (rewards, values, mask)]
  for method in ("chunked", "scan", "associative"):
    got = jax.jit(adv_lib.gae, static_argnames="method")(*args, 1.0, lam, method=method)
    want = adv_lib.gae(rewards, values, mask, 1.0, lam, method=method)
    # Same math, compiled differently (the sharded associative scan fuses in another order): float32 rounding of
    # the rows' scale (|A|, |R| up to ~5 here; measured 2 ulp), not of each entry.
    for g, w in zip(got, want):
      np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-5)
