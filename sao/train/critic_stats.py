"""The critic's diagnostics on its pre-update values V⁰, read off the first critic epoch's own forward pass.

With Monte-Carlo critic targets (λ_critic = 1: `R_t = Σ_k γ^k r_{t+k}` over the action tokens, whatever V) and no
value clipping, an SAO update needs V⁰ only for its diagnostics: the targets do not depend on it and the loss reads no
`old_values`. Epoch 0 of the critic computes exactly V⁰ (it runs the pre-update params), so every critic step also
sums what the diagnostics need over the action tokens it sees (`step_metrics`, merged over micro-batches and length
groups like every step metric), and `Learner` skips its separate pre-update critic forward — one of the update's two
critic forwards (docs/performance.md; 2026-12-02, commit b8b33eb). The learner reports epoch 0's sums as `critic/v0_*`
metrics, and `diagnostics` turns them, on the host, into the same `critic/explained_variance` and
`critic/values/{mean,std,min,max}` that `sao.train.targets.critic_targets` computes from V⁰ itself (to float32
rounding: the variances here are one-pass, `E[x²] − E[x]²`).
"""
from __future__ import annotations

import math
from typing import Any

import flax
import jax
import jax.numpy as jnp
from clu import metrics as clu_metrics

from sao.train.actor_losses import Mean

# The critic step's metrics that only `diagnostics` reads (the learner drops them from what it reports).
PREFIX = "v0_"
RETURNS_VAR = f"critic/{PREFIX}returns_var"  # the learner's metric: the masked variance of the targets R
EPS = 1e-8  # as `sao.core.metrics.explained_variance`: below this return variance the ratio reads 0


@flax.struct.dataclass
class Extreme(clu_metrics.Metric):
  """The min (`sign` = 1) or max (`sign` = −1) of the masked entries, `sign · min(sign · x)`; 0 when none. A
  metric with nothing counted (the steps' zero carry: every field 0) leaves the other unchanged when merged."""
  value: jax.Array  # min of sign · x over what was counted
  count: jax.Array
  sign: float = flax.struct.field(pytree_node=False, default=1.0)

  @classmethod
  def of(cls, x: jax.Array, mask: jax.Array, sign: float) -> "Extreme":
    return cls(value=jnp.min(jnp.where(mask, sign * x, jnp.inf)), count=jnp.sum(mask, dtype=jnp.float32),
               sign=sign)

  def merge(self, other: "Extreme") -> "Extreme":
    value = jnp.where(self.count > 0, jnp.where(other.count > 0, jnp.minimum(self.value, other.value), self.value),
                      other.value)
    return type(self)(value=value, count=self.count + other.count, sign=self.sign)

  def compute(self) -> jax.Array:
    return jnp.where(self.count > 0, self.sign * self.value, 0.0)


@flax.struct.dataclass
class Variance(clu_metrics.Metric):
  """Masked variance `E[x²] − E[x]²` (population; 0 when nothing was counted), from sums that merge."""
  total: jax.Array
  total_sq: jax.Array
  count: jax.Array

  @classmethod
  def of(cls, x: jax.Array, mask: jax.Array) -> "Variance":
    return cls(total=jnp.sum(jnp.where(mask, x, 0.0)), total_sq=jnp.sum(jnp.where(mask, x * x, 0.0)),
               count=jnp.sum(mask, dtype=jnp.float32))

  def merge(self, other: "Variance") -> "Variance":
    return type(self)(total=self.total + other.total, total_sq=self.total_sq + other.total_sq,
                      count=self.count + other.count)

  def compute(self) -> jax.Array:
    n = jnp.maximum(self.count, 1.0)
    mean = self.total / n
    return jnp.maximum(self.total_sq / n - mean * mean, 0.0)


def step_metrics(values: jax.Array, returns: jax.Array, mask: jax.Array) -> dict[str, Any]:
  """The sums behind `diagnostics` for one micro-batch: values, returns `[b, T]` float, mask `[b, T]` bool."""
  v = jax.lax.stop_gradient(values)
  count = jnp.sum(mask, dtype=jnp.float32)
  return {f"{PREFIX}mean": Mean(total=jnp.sum(jnp.where(mask, v, 0.0)), count=count),
          f"{PREFIX}var": Variance.of(v, mask),
          f"{PREFIX}min": Extreme.of(v, mask, 1.0),
          f"{PREFIX}max": Extreme.of(v, mask, -1.0),
          f"{PREFIX}residual_var": Variance.of(returns - v, mask)}


def split(metrics: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
  """A critic step's computed metrics → (the ones it reports, the `PREFIX` ones `diagnostics` reads)."""
  return ({k: v for k, v in metrics.items() if not k.startswith(PREFIX)},
          {k: v for k, v in metrics.items() if k.startswith(PREFIX)})


def diagnostics(metrics: dict[str, float]) -> dict[str, float]:
  """`metrics` (host floats) with the first critic epoch's `critic/` + `PREFIX` sums and `RETURNS_VAR` (the
  masked variance of the targets R) replaced by `critic/explained_variance = 1 − Var(R − V⁰) / Var(R)` (0 when
  `Var(R) <= EPS`) and `critic/values/{mean,std,min,max}`; metrics without them are returned as they are. On the
  host, after the update's one fetch: no program, no sync."""
  key = lambda name: f"critic/{PREFIX}{name}"
  if RETURNS_VAR not in metrics:
    return metrics
  out = {k: v for k, v in metrics.items() if not k.startswith(f"critic/{PREFIX}")}
  returns_var, residual_var = metrics[RETURNS_VAR], metrics[key("residual_var")]
  out["critic/explained_variance"] = 1.0 - residual_var / returns_var if returns_var > EPS else 0.0
  out["critic/values/mean"] = metrics[key("mean")]
  out["critic/values/std"] = math.sqrt(metrics[key("var")])
  out["critic/values/min"] = metrics[key("min")]
  out["critic/values/max"] = metrics[key("max")]
  return out
