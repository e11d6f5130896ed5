"""Statistics over the entries where a mask is 1.

Reductions are plain `jnp.sum`s over all axes, so under `jit` with inputs sharded over a mesh's batch axes XLA
inserts the cross-device all-reduce and the statistics are the *global* ones (tested on 8 fake devices).
Inputs may be float32 or bfloat16; statistics are computed in float32.
"""
from typing import NamedTuple, Sequence

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


class Moments(NamedTuple):
  """Masked moments of one part of a batch, mergeable across parts (`merge_moments`): the count `n = Σ m`, the mean
  `Σ m·x / n` and the centred sum of squares `M2 = Σ m·(x − mean)²` (mean = M2 = 0 when n = 0), the min and max
  (±inf when n = 0). Scalars, float32."""
  count: jax.Array
  mean: jax.Array
  m2: jax.Array
  min: jax.Array
  max: jax.Array

  @property
  def var(self) -> jax.Array:
    """The population variance `M2 / n` (0 when n = 0), as `masked_var`."""
    return jnp.where(self.count > 0, self.m2 / jnp.maximum(self.count, 1.0), 0.0)

  def summary(self, prefix: str) -> dict[str, jax.Array]:
    """`{prefix/mean, prefix/std, prefix/min, prefix/max}` as `sao.core.metrics.masked_summary` (0 when empty)."""
    some = self.count > 0
    return {f"{prefix}/mean": self.mean, f"{prefix}/std": jnp.sqrt(self.var),
            f"{prefix}/min": jnp.where(some, self.min, 0.0), f"{prefix}/max": jnp.where(some, self.max, 0.0)}


def masked_moments(x: jax.Array, mask: jax.Array) -> Moments:
  """`Moments` of the entries of `x` where `mask` is 1 (two-pass within the part, as `masked_var`)."""
  x, mask = _prepare(x, mask)
  count = jnp.sum(mask, dtype=jnp.float32)
  mean = jnp.sum(jnp.where(mask, x, 0.0)) / jnp.maximum(count, 1.0)
  m2 = jnp.sum(jnp.where(mask, (x - mean) ** 2, 0.0))
  return Moments(count, mean, m2, jnp.min(jnp.where(mask, x, jnp.inf)), jnp.max(jnp.where(mask, x, -jnp.inf)))


def merge_moments(parts: Sequence[Moments]) -> Moments:
  """The `Moments` of the union of disjoint parts, by the parallel form of Chan et al.'s update:
  `n = Σ n_g`, `mean = Σ n_g·mean_g / n`, `M2 = Σ M2_g + Σ n_g·(mean_g − mean)²` — no difference of two large sums
  of squares, so it keeps float32's digits when |mean| ≫ std. Empty parts (n_g = 0) add nothing."""
  if not parts:
    raise ValueError("merge_moments: no parts")
  count, mean, m2, low, high = (jnp.stack([jnp.asarray(v, jnp.float32) for v in field]) for field in zip(*parts))
  n = jnp.sum(count)
  merged_mean = jnp.sum(count * mean) / jnp.maximum(n, 1.0)
  merged_m2 = jnp.sum(m2) + jnp.sum(count * (mean - merged_mean) ** 2)
  return Moments(n, merged_mean, merged_m2, jnp.min(low), jnp.max(high))
