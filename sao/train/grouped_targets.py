"""An SAO update's targets over a batch cut into length groups, computed group by group on the device.

With `batching.length_groups` the learner cuts the host batch once into groups `[b_g, T_g]` (rows sorted by length,
each group padded to its own bucket) and keeps every per-token array of the update in that layout: the critic's
values, its targets R, the advantages A and the actor's batch. GAE runs along each row, so a group's R and A are its
rows' R and A of the whole batch; what spans the batch — whitening and the logged statistics — is merged from each
group's masked `Moments` (`sao.core.masked.merge_moments`, Chan et al.'s parallel update). Nothing is fetched to the
host and nothing is re-cut between the update's programs, so the host queues the whole update without waiting for
any of them (the whole-batch layout fetched the values and the advantages to re-cut them: ≈ 30–40 ms a toy update
of XLA waiting for the host, docs/performance_learner.md).

These are the grouped twins of `sao.train.targets` (same equations, same metric names, equal to float rounding;
tests/train/test_grouped_targets.py holds them to it), one program per group shape plus one merge per group count:

    returns    R_g = Σ_k γ^k r_{t+k} (λ_critic = 1)            `monte_carlo_returns(part, γ)`
               or R_g = GAE(r, V⁰_g, γ, λ_critic) + V⁰_g       `critic_targets(part, V⁰_g, γ, λ_critic)`
    advantages A_g = GAE(r, V¹_g, γ, λ_b)                       `policy_advantages(part, V¹_g, R_g, γ, α, λ)`
    whitening  A_g ← (A_g − mean_m A) / sqrt(var_m A + 1e-8)    `whiten(A_g, m_g, merged moments of A)`

The `merge_*` functions turn the groups' statistics into the whole batch's metrics.
"""
from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp

from sao.core import advantages as adv_lib
from sao.core import metrics as metrics_lib
from sao.core.masked import Moments, masked_moments, merge_moments
from sao.train import mesh_jit, targets

WHITEN_EPS = 1e-8  # as `sao.core.advantages.masked_whiten`'s default


def explained_variance(returns: Moments, residual: Moments) -> jax.Array:
  """`sao.core.metrics.explained_variance` from merged moments of R and R − V."""
  return metrics_lib.explained_variance_of(returns.var, residual.var)


@mesh_jit.program(static_argnums=(1,))
def monte_carlo_returns(part: dict, gamma: float) -> tuple[jax.Array, Moments]:
  """A group's Monte-Carlo returns `R_g` `[b, T_g]` (λ_critic = 1, needing no values) and their moments."""
  mask = part["action_mask"]
  _, returns = adv_lib.gae(part["token_rewards"], jnp.zeros(mask.shape, jnp.float32), mask, gamma, 1.0)
  return returns, masked_moments(returns, mask)


@mesh_jit.program(static_argnums=(2, 3))
def critic_targets(part: dict, values: jax.Array, gamma: float, lam: float) -> tuple[jax.Array, dict[str, Moments]]:
  """A group's `R_g = GAE(r, V⁰_g, γ, λ_critic) + V⁰_g` and the moments of V⁰, R and R − V⁰."""
  mask = part["action_mask"]
  _, returns = adv_lib.gae(part["token_rewards"], values, mask, gamma, lam)
  return returns, {"values": masked_moments(values, mask), "returns": masked_moments(returns, mask),
                   "residual": masked_moments(returns - values, mask)}


@mesh_jit.program(static_argnums=(3, 4, 5))
def policy_advantages(part: dict, values: jax.Array, returns: jax.Array, gamma: float, alpha: float,
                      fixed_lambda: float = 0.0) -> tuple[jax.Array, dict[str, Any]]:
  """A group's unwhitened `A_g = GAE(r, V¹_g, γ, λ_b)` (λ_b = 1 − 1/(α·l_b), or `fixed_lambda` when > 0) and what
  the batch's metrics merge: the moments of A and of R − V¹, the sum of λ over rows with an action token and their
  count."""
  mask = part["action_mask"]
  lam = targets.policy_lambda(mask, alpha, fixed_lambda)
  advantages, _ = adv_lib.gae(part["token_rewards"], values, mask, gamma, lam)
  acting = jnp.any(mask, -1)
  return advantages, {"advantages": masked_moments(advantages, mask),
                      "residual": masked_moments(returns - values, mask),
                      "lambda_sum": jnp.sum(jnp.where(acting, lam, 0.0)),
                      "lambda_rows": jnp.sum(acting, dtype=jnp.float32)}


@mesh_jit.program
def whiten(advantages: jax.Array, mask: jax.Array, batch_moments: Moments) -> tuple[jax.Array, Moments]:
  """A group's `A_g` whitened with the whole batch's mean and variance (`masked_whiten`'s equation; 0 off the
  mask) and the moments of the result."""
  mask = mask.astype(bool)
  white = jnp.where(mask, (advantages - batch_moments.mean) * jax.lax.rsqrt(batch_moments.var + WHITEN_EPS), 0.0)
  return white, masked_moments(white, mask)


@mesh_jit.program
def merge_returns(parts: Sequence[Moments]) -> tuple[Moments, jax.Array, dict[str, jax.Array]]:
  """The groups' `monte_carlo_returns` moments → (R's merged moments, its masked variance, `critic/returns/*`)."""
  returns = merge_moments(parts)
  return returns, returns.var, returns.summary("critic/returns")


@mesh_jit.program
def merge_critic_targets(parts: Sequence[dict[str, Moments]]) -> tuple[Moments, dict[str, jax.Array]]:
  """The groups' `critic_targets` statistics → (R's merged moments, `targets.critic_targets`' diagnostics)."""
  merged = {k: merge_moments([p[k] for p in parts]) for k in parts[0]}
  return merged["returns"], {"critic/explained_variance": explained_variance(merged["returns"], merged["residual"]),
                             **merged["values"].summary("critic/values"),
                             **merged["returns"].summary("critic/returns")}


@mesh_jit.program
def merge_advantages(parts: Sequence[dict[str, Any]], returns: Moments) -> tuple[Moments, dict[str, jax.Array]]:
  """The groups' `policy_advantages` statistics and R's merged moments → (A's merged moments, the diagnostics
  `targets.policy_advantages` reports before whitening)."""
  advantages = merge_moments([p["advantages"] for p in parts])
  residual = merge_moments([p["residual"] for p in parts])
  rows = sum(p["lambda_rows"] for p in parts)
  return advantages, {
      "critic/explained_variance_after": explained_variance(returns, residual),
      "advantages/mean_before_whiten": advantages.mean,
      "advantages/std_before_whiten": jnp.sqrt(advantages.var),
      "advantages/lambda_mean": sum(p["lambda_sum"] for p in parts) / jnp.maximum(rows, 1.0)}


@mesh_jit.program
def merge_final(parts: Sequence[Moments]) -> dict[str, jax.Array]:
  """The moments of the advantages the actor trains on → `advantages/mean`, `advantages/std`."""
  merged = merge_moments(parts)
  return {"advantages/mean": merged.mean, "advantages/std": jnp.sqrt(merged.var)}
