"""Policy and value losses: SAO's DIS, the rollout-mismatch corrections TIS and IcePop, GSPO, the GRPO/PPO token-level clip, the token NLL, and the (clipped) value loss.

Every loss returns `(loss, aux)`. `aux["loss_sum"]` and `aux["denominator"]` are the unreduced numerator and the
normaliser (`loss = loss_sum / denominator`), so gradient accumulation over micro-batches can sum `loss_sum`
gradients and divide once by the *full-batch* denominator, reproducing the full-batch gradient exactly. Ratios
reported in `aux` come with their numerators (`*_count`, `*_sum`) for the same reason.

Shapes: `logprobs`, `rollout_logprobs`, `old_logprobs`, `action_mask`, token `advantages`: `[B, T]`; sequence
advantages `[B]`. Log-probs are aligned with the token they score (`logprobs[b, t] = log π(token_t | tokens_<t)`).
"""
import jax
import jax.numpy as jnp

from sao.core import checks

__all__ = ["dis_policy_loss", "gspo_policy_loss", "icepop_policy_loss", "nll_loss", "ppo_clip_policy_loss",
           "tis_policy_loss", "value_loss"]


def _token_inputs(names, arrays, mask):
  arrays = [checks.float_array(n, a, ndim=2) for n, a in zip(names, arrays)]
  mask = checks.mask_array("action_mask", mask, ndim=2)
  checks.same_shape(list(names) + ["action_mask"], arrays + [mask])
  dtype = checks.compute_dtype(*arrays)
  return [a.astype(dtype) for a in arrays], mask


def _token_advantages(advantages, shape, dtype):
  advantages = checks.float_array("advantages", advantages)
  if advantages.ndim == 1 and advantages.shape[0] == shape[0]:
    advantages = advantages[:, None]
  elif advantages.shape != shape:
    raise ValueError(f"advantages must have shape [B, T]={shape} or [B]=({shape[0]},), got {advantages.shape}")
  return jnp.broadcast_to(advantages.astype(dtype), shape)


def _denominator(count):
  return jnp.maximum(count, 1.0)


def dis_policy_loss(
    logprobs: jax.Array,
    rollout_logprobs: jax.Array,
    advantages: jax.Array,
    action_mask: jax.Array,
    ratio_low: float = 0.2,
    ratio_high: float = 4.0,
) -> tuple[jax.Array, dict[str, jax.Array]]:
  """SAO's direct double-sided importance-sampling (DIS) REINFORCE loss.

      r_t = exp(logp_θ(a_t) − logp_rollout(a_t))
      f(r) = r if ratio_low < r < ratio_high else 0          (a stop-gradient weight)
      L = −(1/N) Σ_t m_t · f(r_t) · A_t · logp_θ(a_t),      N = Σ_t m_t

  The behaviour policy is the rollout engine's own log-probs; there is no π_old and no KL term. Tokens outside the
  window get zero weight (hence zero gradient) but stay in the denominator N. The gradient on a kept token is
  `−f(r_t)·A_t·∇logp_θ(a_t)/N`. SWE defaults: window (0.2, 4.0), i.e. ε_l = 0.8, ε_h = 3.0.

  Args:
    logprobs: `[B, T]` trainer log-probs (differentiated).
    rollout_logprobs: `[B, T]` the rollout engine's log-probs of the same tokens.
    advantages: `[B, T]` (or `[B]`, broadcast over tokens).
    action_mask: `[B, T]` bool/int.

  Returns:
    `(loss, aux)` with `loss_sum`, `denominator`, `masked_fraction` (share of action tokens outside the window),
    `masked_count`, `ratio_mean`, `ratio_min`, `ratio_max`.
  """
  if not 0.0 <= ratio_low < 1.0 < ratio_high:
    raise ValueError(f"need 0 <= ratio_low < 1 < ratio_high, got ratio_low={ratio_low}, ratio_high={ratio_high}")
  (logprobs, rollout_logprobs), mask = _token_inputs(
      ["logprobs", "rollout_logprobs"], [logprobs, rollout_logprobs], action_mask)
  advantages = _token_advantages(advantages, logprobs.shape, logprobs.dtype)
  log_ratio = jnp.where(mask, jax.lax.stop_gradient(logprobs) - rollout_logprobs, 0.0)
  ratio = jnp.exp(log_ratio)
  in_window = (ratio > ratio_low) & (ratio < ratio_high) & mask
  weight = jnp.where(in_window, ratio, 0.0)
  count = jnp.sum(mask, dtype=logprobs.dtype)
  loss_sum = -jnp.sum(jnp.where(in_window, weight * advantages * logprobs, 0.0))
  denominator = _denominator(count)
  masked_count = count - jnp.sum(in_window, dtype=logprobs.dtype)
  aux = {
      "loss_sum": loss_sum,
      "denominator": denominator,
      "masked_count": masked_count,
      "masked_fraction": masked_count / denominator,
      "ratio_mean": jnp.sum(jnp.where(mask, ratio, 0.0)) / denominator,
      # An empty mask reports 1 (the on-policy ratio) rather than ±inf.
      "ratio_min": jnp.where(count > 0, jnp.min(jnp.where(mask, ratio, jnp.inf)), 1.0),
      "ratio_max": jnp.where(count > 0, jnp.max(jnp.where(mask, ratio, -jnp.inf)), 1.0),
  }
  return loss_sum / denominator, aux


def _rollout_ratio_inputs(logprobs, rollout_logprobs, advantages, action_mask):
  """Checked `(logprobs, advantages [B, T], mask, ratio = exp(sg(logp_θ) − logp_rollout) [B, T] (1 off the mask),
  count = Σ m)` in the compute dtype."""
  (logprobs, rollout_logprobs), mask = _token_inputs(
      ["logprobs", "rollout_logprobs"], [logprobs, rollout_logprobs], action_mask)
  advantages = _token_advantages(advantages, logprobs.shape, logprobs.dtype)
  ratio = jnp.exp(jnp.where(mask, jax.lax.stop_gradient(logprobs) - rollout_logprobs, 0.0))
  return logprobs, advantages, mask, ratio, jnp.sum(mask, dtype=logprobs.dtype)


def tis_policy_loss(
    logprobs: jax.Array,
    rollout_logprobs: jax.Array,
    advantages: jax.Array,
    action_mask: jax.Array,
    cap: float = 2.0,
) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Truncated importance sampling (TIS; Yao, Liu et al. 2025, "Your efficient RL framework secretly brings you
  off-policy RL training") on the REINFORCE loss.

      k_t = exp(logp_θold(a_t) − logp_rollout(a_t))          (trainer over engine, a stop-gradient weight)
      w_t = min(k_t, C)
      L = −(1/N) Σ_t m_t · w_t · A_t · logp_θ(a_t),          N = Σ_t m_t

  TIS multiplies the policy-gradient term by the trainer/engine ratio truncated from above only: unlike DIS and
  IcePop no token is dropped, tokens the engine over-sampled (k < 1) are down-weighted and the rare under-sampled
  ones (k ≫ 1) weigh at most C. SAO takes one actor step per batch, so π_θold is the policy at the step
  (`sg(logp_θ)`), and the PPO ratio of the published objective, `π_θ/π_θold`, is 1 with gradient `∇logp_θ`:
  this loss has the same gradient. The published cap is C = 2 (verl's `tis_imp_ratio_cap`).

  Args:
    logprobs: `[B, T]` trainer log-probs (differentiated).
    rollout_logprobs: `[B, T]` the rollout engine's log-probs of the same tokens.
    advantages: `[B, T]` (or `[B]`, broadcast over tokens).
    action_mask: `[B, T]` bool/int.
    cap: C > 0.

  Returns:
    `(loss, aux)` with `loss_sum`, `denominator`, `truncated_count` (action tokens with k > C),
    `truncated_fraction`, `weight_sum` and `weight_mean` (Σ and mean of w over action tokens).
  """
  if not cap > 0:
    raise ValueError(f"cap must be > 0, got {cap}")
  logprobs, advantages, mask, ratio, count = _rollout_ratio_inputs(logprobs, rollout_logprobs, advantages,
                                                                   action_mask)
  weight = jnp.minimum(ratio, cap)
  loss_sum = -jnp.sum(jnp.where(mask, weight * advantages * logprobs, 0.0))
  denominator = _denominator(count)
  truncated_count = jnp.sum(mask & (ratio > cap), dtype=logprobs.dtype)
  weight_sum = jnp.sum(jnp.where(mask, weight, 0.0))
  aux = {
      "loss_sum": loss_sum,
      "denominator": denominator,
      "truncated_count": truncated_count,
      "truncated_fraction": truncated_count / denominator,
      "weight_sum": weight_sum,
      "weight_mean": weight_sum / denominator,
  }
  return loss_sum / denominator, aux


def icepop_policy_loss(
    logprobs: jax.Array,
    rollout_logprobs: jax.Array,
    advantages: jax.Array,
    action_mask: jax.Array,
    ratio_low: float = 0.5,
    ratio_high: float = 5.0,
) -> tuple[jax.Array, dict[str, jax.Array]]:
  """IcePop (Ling Team 2025, the Ring-1T report "Every Step Evolves"): token-level masked importance sampling.

      k_t = exp(logp_θold(a_t) − logp_rollout(a_t))          (a stop-gradient weight)
      M(k) = k if α ≤ k ≤ β else 0
      L = −(1/N) Σ_t m_t · M(k_t) · A_t · logp_θ(a_t),       N = Σ_t m_t

  Tokens whose trainer/engine ratio leaves the closed band [α, β] are dropped from the gradient (they stay in N);
  the others are importance-weighted by k. As for TIS, one actor step per batch makes π_θold the policy at the step
  and the report's PPO ratio 1, so this REINFORCE form has the objective's gradient. The report's band is
  [α, β] = [0.5, 5]. It is DIS's equation (`dis_policy_loss`) with a closed band instead of an open one and its
  own bounds: the registry keeps it as its own entry so an ablation names the published method and settings.

  Args:
    logprobs, rollout_logprobs, advantages, action_mask: as `tis_policy_loss`.
    ratio_low, ratio_high: α, β with `0 <= α < 1 < β`.

  Returns:
    `(loss, aux)` with `loss_sum`, `denominator`, `masked_count` (action tokens outside [α, β]), `masked_fraction`.
  """
  if not 0.0 <= ratio_low < 1.0 < ratio_high:
    raise ValueError(f"need 0 <= ratio_low < 1 < ratio_high, got ratio_low={ratio_low}, ratio_high={ratio_high}")
  logprobs, advantages, mask, ratio, count = _rollout_ratio_inputs(logprobs, rollout_logprobs, advantages,
                                                                   action_mask)
  kept = mask & (ratio >= ratio_low) & (ratio <= ratio_high)
  loss_sum = -jnp.sum(jnp.where(kept, ratio * advantages * logprobs, 0.0))
  denominator = _denominator(count)
  masked_count = count - jnp.sum(kept, dtype=logprobs.dtype)
  aux = {
      "loss_sum": loss_sum,
      "denominator": denominator,
      "masked_count": masked_count,
      "masked_fraction": masked_count / denominator,
  }
  return loss_sum / denominator, aux


def gspo_policy_loss(
    logprobs: jax.Array,
    old_logprobs: jax.Array,
    seq_advantages: jax.Array,
    action_mask: jax.Array,
    clip_low: float = 3e-4,
    clip_high: float = 4e-4,
) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Group Sequence Policy Optimization (sequence-level, length-normalised ratio, clipped).

      s_i = exp( (1/|y_i|) Σ_t m_t (logp_θ − logp_old) )
      J = (1/G) Σ_i min( s_i Â_i, clip(s_i, 1 − clip_low, 1 + clip_high) Â_i ),   L = −J

  G counts sequences with at least one action token (empty rows contribute nothing). No KL term.

  Args:
    logprobs, old_logprobs: `[B, T]`.
    seq_advantages: `[B]` one advantage per sequence (e.g. `group_advantages`).
    action_mask: `[B, T]`.

  Returns:
    `(loss, aux)` with `loss_sum`, `denominator` (sequences), `clip_fraction` (sequences whose clipped term is the
    active one), `clip_count`, `seq_ratio_mean`.
  """
  (logprobs, old_logprobs), mask = _token_inputs(["logprobs", "old_logprobs"], [logprobs, old_logprobs], action_mask)
  seq_advantages = checks.float_array("seq_advantages", seq_advantages, ndim=1)
  if seq_advantages.shape[0] != logprobs.shape[0]:
    raise ValueError(f"seq_advantages has shape {seq_advantages.shape}, expected [B]=({logprobs.shape[0]},)")
  adv = seq_advantages.astype(logprobs.dtype)
  lengths = jnp.sum(mask, axis=-1, dtype=logprobs.dtype)
  valid = lengths > 0
  mean_log_ratio = jnp.sum(jnp.where(mask, logprobs - old_logprobs, 0.0), axis=-1) / jnp.maximum(lengths, 1.0)
  seq_ratio = jnp.exp(mean_log_ratio)
  clipped_ratio = jnp.clip(seq_ratio, 1.0 - clip_low, 1.0 + clip_high)
  unclipped_obj = seq_ratio * adv
  clipped_obj = clipped_ratio * adv
  objective = jnp.minimum(unclipped_obj, clipped_obj)
  clip_active = valid & (clipped_obj < unclipped_obj)
  num_seqs = jnp.sum(valid, dtype=logprobs.dtype)
  loss_sum = -jnp.sum(jnp.where(valid, objective, 0.0))
  denominator = _denominator(num_seqs)
  clip_count = jnp.sum(clip_active, dtype=logprobs.dtype)
  aux = {
      "loss_sum": loss_sum,
      "denominator": denominator,
      "clip_count": clip_count,
      "clip_fraction": clip_count / denominator,
      "seq_ratio_mean": jnp.sum(jnp.where(valid, jax.lax.stop_gradient(seq_ratio), 0.0)) / denominator,
  }
  return loss_sum / denominator, aux


def ppo_clip_policy_loss(
    logprobs: jax.Array,
    old_logprobs: jax.Array,
    advantages: jax.Array,
    action_mask: jax.Array,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Token-level clipped surrogate (PPO/GRPO) with token-mean aggregation.

      r_t = exp(logp_θ − logp_old)
      L = −(1/N) Σ_t m_t · min( r_t A_t, clip(r_t, 1 − clip_low, 1 + clip_high) A_t ),   N = Σ m_t

  Args:
    logprobs, old_logprobs: `[B, T]`.
    advantages: `[B, T]`, or `[B]` (GRPO: the sequence's advantage on each of its tokens).
    action_mask: `[B, T]`.

  Returns:
    `(loss, aux)` with `loss_sum`, `denominator`, `clip_fraction`, `clip_count`, `approx_kl` (mean of
    `(r − 1) − log r`, the k3 estimator).
  """
  (logprobs, old_logprobs), mask = _token_inputs(["logprobs", "old_logprobs"], [logprobs, old_logprobs], action_mask)
  advantages = _token_advantages(advantages, logprobs.shape, logprobs.dtype)
  log_ratio = jnp.where(mask, logprobs - old_logprobs, 0.0)
  ratio = jnp.exp(log_ratio)
  unclipped_obj = ratio * advantages
  clipped_obj = jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high) * advantages
  objective = jnp.minimum(unclipped_obj, clipped_obj)
  count = jnp.sum(mask, dtype=logprobs.dtype)
  denominator = _denominator(count)
  loss_sum = -jnp.sum(jnp.where(mask, objective, 0.0))
  clip_count = jnp.sum(mask & (clipped_obj < unclipped_obj), dtype=logprobs.dtype)
  log_ratio_sg = jax.lax.stop_gradient(log_ratio)
  approx_kl = jnp.sum(jnp.where(mask, jnp.expm1(log_ratio_sg) - log_ratio_sg, 0.0)) / denominator
  aux = {
      "loss_sum": loss_sum,
      "denominator": denominator,
      "clip_count": clip_count,
      "clip_fraction": clip_count / denominator,
      "approx_kl": approx_kl,
  }
  return loss_sum / denominator, aux


def nll_loss(logprobs: jax.Array, action_mask: jax.Array) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Supervised masked token negative log-likelihood `L = −(1/N) Σ_t m_t · logp_θ(a_t)`, `N = Σ_t m_t`.

  Args:
    logprobs: `[B, T]` trainer log-probs (differentiated).
    action_mask: `[B, T]` the tokens to imitate.

  Returns:
    `(loss, aux)` with `loss_sum`, `denominator`.
  """
  (logprobs,), mask = _token_inputs(["logprobs"], [logprobs], action_mask)
  loss_sum = -jnp.sum(jnp.where(mask, logprobs, 0.0))
  denominator = _denominator(jnp.sum(mask, dtype=logprobs.dtype))
  return loss_sum / denominator, {"loss_sum": loss_sum, "denominator": denominator}


def value_loss(
    values: jax.Array,
    returns: jax.Array,
    action_mask: jax.Array,
    old_values: jax.Array | None = None,
    clip: float | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Masked squared error `L = (1/N) Σ_t m_t · ½(V_t − R_t)²`, optionally clipped around `old_values`.

  With `clip = c`: `V^c = V_old + clip(V − V_old, −c, c)` and the per-token loss is
  `½·max((V − R)², (V^c − R)²)` (PPO's pessimistic value clipping).

  Args:
    values: `[B, T]` critic outputs (differentiated).
    returns: `[B, T]` targets (not differentiated).
    action_mask: `[B, T]`.
    old_values: `[B, T]` values at rollout/compute time; required when `clip` is set.

  Returns:
    `(loss, aux)` with `loss_sum`, `denominator`, `value_mean`, and with clipping `clip_fraction`, `clip_count`.
  """
  (values, returns), mask = _token_inputs(["values", "returns"], [values, returns], action_mask)
  returns = jax.lax.stop_gradient(returns)
  per_token = 0.5 * (values - returns) ** 2
  count = jnp.sum(mask, dtype=values.dtype)
  denominator = _denominator(count)
  aux = {}
  if clip is not None:
    if old_values is None:
      raise ValueError("old_values is required when clip is set")
    old_values = checks.float_array("old_values", old_values, ndim=2)
    checks.same_shape(["values", "old_values"], [values, old_values])
    old_values = jax.lax.stop_gradient(old_values.astype(values.dtype))
    clipped = old_values + jnp.clip(values - old_values, -clip, clip)
    clipped_per_token = 0.5 * (clipped - returns) ** 2
    clip_count = jnp.sum(mask & (clipped_per_token > per_token), dtype=values.dtype)
    per_token = jnp.maximum(per_token, clipped_per_token)
    aux.update(clip_count=clip_count, clip_fraction=clip_count / denominator)
  loss_sum = jnp.sum(jnp.where(mask, per_token, 0.0))
  aux.update(
      loss_sum=loss_sum,
      denominator=denominator,
      value_mean=jnp.sum(jnp.where(mask, jax.lax.stop_gradient(values), 0.0)) / denominator,
  )
  return loss_sum / denominator, aux
