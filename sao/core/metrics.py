"""Diagnostics the learner logs: explained variance and masked summaries. Pure functions, scalars out."""
import jax
import jax.numpy as jnp

from sao.core import checks
from sao.core.masked import masked_count, masked_max, masked_mean, masked_min, masked_var

__all__ = ["explained_variance", "explained_variance_of", "masked_summary", "sequence_lengths"]


def explained_variance(values: jax.Array, returns: jax.Array, mask: jax.Array, eps: float = 1e-8) -> jax.Array:
  """Critic explained variance `1 − Var_m(R − V) / Var_m(R)` over masked tokens of the whole batch.

  1 is a perfect critic, 0 is no better than predicting the mean return, negative is worse than that.
  When `Var_m(R) ≤ eps` (e.g. every trajectory in the batch got the same reward) the ratio is undefined and 0.0 is
  returned, so logs and NaN guards stay clean; read it together with the reward's spread.

  Args:
    values, returns: `[B, T]` float.
    mask: `[B, T]` bool/int, usually the action mask.
  """
  values = checks.float_array("values", values)
  returns = checks.float_array("returns", returns)
  checks.same_shape(["values", "returns", "mask"], [values, returns, mask])
  dtype = checks.compute_dtype(values, returns)
  values, returns = values.astype(dtype), returns.astype(dtype)
  return explained_variance_of(masked_var(returns, mask), masked_var(returns - values, mask), eps)


def explained_variance_of(var_returns: jax.Array, var_residual: jax.Array, eps: float = 1e-8) -> jax.Array:
  """`1 − var_residual / var_returns`, 0 when `var_returns ≤ eps`: `explained_variance` from the two variances
  (e.g. merged over the length groups of a batch, `sao.train.grouped_targets`)."""
  some = var_returns > eps
  return jnp.where(some, 1.0 - var_residual / jnp.where(some, var_returns, 1.0), 0.0)


def masked_summary(prefix: str, x: jax.Array, mask: jax.Array) -> dict[str, jax.Array]:
  """`{prefix/mean, prefix/std, prefix/min, prefix/max}` over masked entries."""
  return {
      f"{prefix}/mean": masked_mean(x, mask),
      f"{prefix}/std": jnp.sqrt(masked_var(x, mask)),
      f"{prefix}/min": masked_min(x, mask),
      f"{prefix}/max": masked_max(x, mask),
  }


def sequence_lengths(mask: jax.Array) -> jax.Array:
  """`[B]` number of masked tokens per row (e.g. response length in action tokens), float32."""
  mask = checks.mask_array("mask", mask, ndim=2)
  return jnp.sum(mask, axis=-1, dtype=jnp.float32)


def token_count(mask: jax.Array) -> jax.Array:
  """Total masked tokens, float32 scalar."""
  return masked_count(mask)
