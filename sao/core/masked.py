"""Statistics over the entries where a mask is 1.

Reductions are plain `jnp.sum`s over all axes, so under `jit` with inputs sharded over a mesh's batch axes XLA
inserts the cross-device all-reduce and the statistics are the *global* ones (tested on 8 fake devices).
Inputs may be float32 or bfloat16; statistics are computed in float32.
"""
import jax
import jax.numpy as jnp

from sao.core import checks


def _prepare(x, mask, x_name="x"):
  x = checks.float_array(x_name, x)
  mask = checks.mask_array("mask", mask)
  checks.same_shape([x_name, "mask"], [x, mask])
  return x.astype(checks.compute_dtype(x)), mask


def masked_sum(x: jax.Array, mask: jax.Array) -> jax.Array:
  """`Σ m·x` over all entries. Scalar."""
  x, mask = _prepare(x, mask)
  return jnp.sum(jnp.where(mask, x, 0.0))


def masked_count(mask: jax.Array) -> jax.Array:
  """`Σ m` as a float32 scalar."""
  return jnp.sum(checks.mask_array("mask", mask), dtype=jnp.float32)


def masked_mean(x: jax.Array, mask: jax.Array) -> jax.Array:
  """`mean_m(x) = Σ m·x / Σ m` over all entries; 0 when the mask is empty. Scalar."""
  x, mask = _prepare(x, mask)
  count = jnp.sum(mask, dtype=x.dtype)
  return jnp.sum(jnp.where(mask, x, 0.0)) / jnp.maximum(count, 1.0)


def masked_var(x: jax.Array, mask: jax.Array, unbiased: bool = False) -> jax.Array:
  """`var_m(x) = Σ m·(x − mean_m x)² / n`, `n = Σ m` (or `n − 1` when `unbiased`); 0 when n ≤ 1 (unbiased) or 0.

  Two-pass (mean first) for accuracy on large batches. Scalar.
  """
  x, mask = _prepare(x, mask)
  count = jnp.sum(mask, dtype=x.dtype)
  mean = jnp.sum(jnp.where(mask, x, 0.0)) / jnp.maximum(count, 1.0)
  sum_sq = jnp.sum(jnp.where(mask, (x - mean) ** 2, 0.0))
  denom = count - 1.0 if unbiased else count
  return jnp.where(denom > 0, sum_sq / jnp.maximum(denom, 1.0), 0.0)


def masked_whiten(x: jax.Array, mask: jax.Array, eps: float = 1e-8) -> jax.Array:
  """`(x − mean_m x) / sqrt(var_m x + eps)` where `m = 1`, 0 elsewhere.

  The statistics are over all masked entries of the whole (global) batch; `var_m` is the population variance, so the
  whitened entries have mean 0 and variance `var/(var + eps)` ≈ 1 over the mask. Output in the compute dtype.
  """
  x, mask = _prepare(x, mask)
  mean = masked_mean(x, mask)
  var = masked_var(x, mask)
  return jnp.where(mask, (x - mean) * jax.lax.rsqrt(var + eps), 0.0)


def masked_min(x: jax.Array, mask: jax.Array) -> jax.Array:
  """Minimum over masked entries; 0 when the mask is empty."""
  x, mask = _prepare(x, mask)
  return jnp.where(jnp.any(mask), jnp.min(jnp.where(mask, x, jnp.inf)), 0.0)


def masked_max(x: jax.Array, mask: jax.Array) -> jax.Array:
  """Maximum over masked entries; 0 when the mask is empty."""
  x, mask = _prepare(x, mask)
  return jnp.where(jnp.any(mask), jnp.max(jnp.where(mask, x, -jnp.inf)), 0.0)
