"""The jitted programs of an update that turn critic values and rewards into training targets (pure functions of
the `[B, T]` batch, `sao.train.learner` calls them by module attribute so `sao.aot.driver` can record them):

- `critic_targets`: `R = GAE(r, V⁰, γ, λ_critic) + V⁰` and the critic's diagnostics on the pre-update values;
- `monte_carlo_returns`: the same R at λ_critic = 1, which needs no V⁰;
- `policy_advantages`: `A = GAE(r, V¹, γ, λ_b)` with the length-adaptive `λ_b = 1 − 1/(α·l_b)` (or a fixed λ),
  whitened over the batch's action tokens when asked;
- `group_advantages`: GSPO / GRPO's group-normalised rewards `Â_i`.
"""
from __future__ import annotations


import jax
import jax.numpy as jnp

from sao.core import advantages as adv_lib
from sao.core import metrics as metrics_lib
from sao.train import actor_losses, batching, mesh_jit

# What each algorithm's update hands the actor loss besides `batching.FIELDS`.
ADVANTAGES_FOR_ALGORITHM = {"sao": "advantages", "gspo": "seq_advantages", "grpo": "seq_advantages"}


def check_loss_fits_algorithm(loss: actor_losses.ActorLoss, algorithm: str) -> None:
  available = set(batching.FIELDS) | {batching.ROUTED_EXPERTS, ADVANTAGES_FOR_ALGORITHM[algorithm]}
  missing = [k for k in loss.batch_keys if k not in available]
  if missing:
    raise ValueError(f"learner config: actor_loss {loss.name!r} reads {missing}, which algorithm {algorithm!r} does "
                     f"not provide (it provides {sorted(available)})")


@mesh_jit.program(static_argnums=(2, 3))
def critic_targets(batch, values, gamma: float, lam: float):
  """Returns `R = A + V` with γ, λ_critic (before any whitening) and critic diagnostics on the pre-update values."""
  mask = batch["action_mask"]
  _, returns = adv_lib.gae(batch["token_rewards"], values, mask, gamma, lam)
  diag = {"critic/explained_variance": metrics_lib.explained_variance(values, returns, mask),
          **metrics_lib.masked_summary("critic/values", values, mask),
          **metrics_lib.masked_summary("critic/returns", returns, mask)}
  return returns, diag


def critic_reads_values_before(learner_config) -> bool:
  """Whether the critic's targets or loss read the pre-update values V⁰ (λ_critic < 1, a value clip, or V-trace
  targets, `sao.train.critic_correction`); if not, the update computes R with `monte_carlo_returns` and skips its
  pre-update critic forward (`sao.train.learner`)."""
  return (learner_config.sao.lambda_critic != 1.0 or learner_config.critic.value_clip > 0
          or learner_config.sao.critic_target_correction != "none")


@mesh_jit.program(static_argnums=(1,))
def monte_carlo_returns(batch, gamma: float):
  """`critic_targets` at λ_critic = 1, where `R = GAE(r, V, γ, 1) + V = Σ_k γ^k r_{t+k}` (over the action tokens)
  whatever V: computed with V = 0, so no pre-update critic forward is needed. Returns (R `[B, T]`, the masked
  variance of R, the returns' diagnostics; the values' come from `sao.train.critic_stats`)."""
  mask = batch["action_mask"]
  _, returns = adv_lib.gae(batch["token_rewards"], jnp.zeros(mask.shape, jnp.float32), mask, gamma, 1.0)
  return returns, adv_lib.masked_var(returns, mask), metrics_lib.masked_summary("critic/returns", returns, mask)


@mesh_jit.program(static_argnums=(3, 4, 5, 6))
def policy_advantages(batch, values, returns, gamma: float, alpha: float, whiten: bool, fixed_lambda: float = 0.0):
  """`A = GAE(r, V, γ, λ_b = 1 − 1/(α·l_b))` (or λ_b = `fixed_lambda` when > 0), whitened over the batch's action
  tokens when `whiten`."""
  mask = batch["action_mask"]
  lam = policy_lambda(mask, alpha, fixed_lambda)
  advantages, _ = adv_lib.gae(batch["token_rewards"], values, mask, gamma, lam)
  diag = {"critic/explained_variance_after": metrics_lib.explained_variance(values, returns, mask),
          "advantages/mean_before_whiten": adv_lib.masked_mean(advantages, mask),
          "advantages/std_before_whiten": jnp.sqrt(adv_lib.masked_var(advantages, mask)),
          "advantages/lambda_mean": jnp.sum(jnp.where(jnp.any(mask, -1), lam, 0.0)) /
                                    jnp.maximum(jnp.sum(jnp.any(mask, -1)), 1)}
  if whiten:
    advantages = adv_lib.masked_whiten(advantages, mask)
  diag["advantages/mean"] = adv_lib.masked_mean(advantages, mask)
  diag["advantages/std"] = jnp.sqrt(adv_lib.masked_var(advantages, mask))
  return advantages, diag


def policy_lambda(mask: jax.Array, alpha: float, fixed_lambda: float = 0.0) -> jax.Array:
  """The policy's per-row λ_b `[B]`: `1 − 1/(α·l_b)` (`length_adaptive_lambda`), or `fixed_lambda` when > 0 (the
  ablation of the length-adaptive λ)."""
  if fixed_lambda > 0.0:
    return jnp.full(mask.shape[:1], fixed_lambda, jnp.float32)
  return adv_lib.length_adaptive_lambda(mask, alpha)


@mesh_jit.program(static_argnums=(1,))
def group_advantages(batch, normalize_std: bool):
  """`Â_i = (r_i − mean_g r)/(std_g r + 1e-6)` per group (padding rows are groups of one: Â = 0)."""
  seq_adv = adv_lib.group_advantages(batch["rewards"], batch["group_ids"], normalize_std)
  valid = batch["valid"]
  n = jnp.maximum(jnp.sum(valid), 1)
  mean = jnp.sum(jnp.where(valid, seq_adv, 0.0)) / n
  std = jnp.sqrt(jnp.sum(jnp.where(valid, (seq_adv - mean) ** 2, 0.0)) / n)
  return seq_adv, {"advantages/mean": mean, "advantages/std": std}
