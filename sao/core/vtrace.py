"""V-trace critic targets (Espeholt et al. 2018, IMPALA) over the action tokens of agent trajectories.

The behaviour policy μ is the rollout engine (its log-probs come with each trajectory), the target policy π the
trainer's current policy. With `k_t = π(a_t)/μ(a_t)` on action token `t`, the truncated ratios

    ρ_t = min(ρ̄, k_t),        c_t = λ · min(c̄, k_t)

and, as in `sao.core.advantages.gae`, the recursion running over action tokens only (tool observations are
context, never actions: they are *bridged*, costing no discount step, contributing no value, their rewards ignored),
from `v_{T} = V_{T} = 0` past the last action token, for action tokens `t` with next action token `t⁺`:

    δ_t = ρ_t · (r_t + γ·V_{t⁺} − V_t)
    v_t − V_t = δ_t + γ·c_t·(v_{t⁺} − V_{t⁺})

which unrolls to Espeholt et al.'s eq. (1), `v_s = V_s + Σ_{t≥s} γ^{t−s} (Π_{i=s}^{t−1} c_i) δ_t`, with the λ of
their remark 2 (`c_i = λ·min(c̄, k_i)`): λ_critic keeps its meaning. On-policy (k ≡ 1, ρ̄, c̄ ≥ 1) it is GAE's
return `R = GAE(r, V, γ, λ) + V` exactly; with ρ̄ = c̄ = 1 no ratio above 1 is ever used, so the targets of a stale
or mismatched batch lean on V where the trainer would not have taken the engine's action.

Pure and jit-compatible; float32 for float32/bfloat16 inputs, float64 for float64 inputs under x64.
"""
import jax
import jax.numpy as jnp

from sao.core import checks
from sao.core.advantages import _linear_recurrence_reverse  # pylint: disable=protected-access  (GAE's own scan)

# A ratio counts as clipped (the `rho_clipped` / `c_clipped` diagnostics) only beyond this relative margin over its
# bar: on-policy tokens have ratios 1 ± float noise (|log k| ≈ 1e-6), which at ρ̄ = 1 would count half of them. The
# truncation itself is exact (min(k, ρ̄)).
CLIP_COUNT_RTOL = 1e-3

__all__ = ["vtrace_returns"]


def vtrace_returns(
    rewards: jax.Array,
    values: jax.Array,
    log_ratio: jax.Array,
    action_mask: jax.Array,
    gamma: float,
    lam: float,
    rho_bar: float = 1.0,
    c_bar: float = 1.0,
) -> tuple[jax.Array, dict[str, jax.Array]]:
  """V-trace targets `v` (module docstring) as two parallel linear recurrences over time.

  1. `u_t` = the value of the first action token at or after `t`: `u_t = (1 − m_t)·u_{t+1} + m_t·V_t`, so the
     next action token's value seen from `t` is `u_{t+1}` (0 past the last one).
  2. `x_t = v_t − V_t` on action tokens: `x_t = a_t·x_{t+1} + b_t` with `(a, b) = (γ·c_t, δ_t)` where `m_t` and
     `(1, 0)` on observation tokens, which carry the next action token's `x` through unchanged.

  Args:
    rewards: `[B, T]` per-token rewards (outcome rewards on the last action token, `place_terminal_reward`).
    values: `[B, T]` critic values V (the pre-update critic's).
    log_ratio: `[B, T]` `log π(a_t) − log μ(a_t)` (read on action tokens only).
    action_mask: `[B, T]` bool/int, 1 on model-action tokens.
    gamma: γ in (0, 1].
    lam: λ_critic in [0, 1].
    rho_bar, c_bar: the truncation levels ρ̄ > 0 and c̄ > 0 (Espeholt et al. use ρ̄ = c̄ = 1).

  Returns:
    `(v, aux)`: `v` `[B, T]` in the compute dtype, 0 where `m = 0`; `aux` holds the action-token counts
    `tokens`, `rho_clipped` (k > ρ̄·(1 + `CLIP_COUNT_RTOL`)) and `c_clipped` (the same for c̄), and `rho_sum` (Σ m·ρ).
  """
  if not (rho_bar > 0 and c_bar > 0):
    raise ValueError(f"rho_bar and c_bar must be > 0, got rho_bar={rho_bar}, c_bar={c_bar}")
  if not 0.0 <= lam <= 1.0:
    raise ValueError(f"lam must be in [0, 1], got {lam}")
  rewards = checks.float_array("rewards", rewards, ndim=2)
  values = checks.float_array("values", values, ndim=2)
  log_ratio = checks.float_array("log_ratio", log_ratio, ndim=2)
  mask = checks.mask_array("action_mask", action_mask, ndim=2)
  checks.same_shape(["values", "rewards", "log_ratio", "action_mask"], [values, rewards, log_ratio, mask])
  dtype = checks.compute_dtype(rewards, values, log_ratio)
  rewards, values, log_ratio = (x.astype(dtype) for x in (rewards, values, log_ratio))
  ratio = jnp.exp(jnp.where(mask, log_ratio, 0.0))
  rho = jnp.minimum(ratio, rho_bar)
  trace = lam * jnp.minimum(ratio, c_bar)
  m = mask.astype(dtype)
  first_value_from = _linear_recurrence_reverse(1.0 - m, m * values)
  next_value = jnp.concatenate([first_value_from[:, 1:], jnp.zeros_like(first_value_from[:, :1])], axis=1)
  delta = rho * (rewards + gamma * next_value - values)
  excess = _linear_recurrence_reverse(jnp.where(mask, gamma * trace, 1.0), jnp.where(mask, delta, 0.0))
  aux = {"tokens": jnp.sum(mask, dtype=dtype),
         "rho_clipped": jnp.sum(mask & (ratio > rho_bar * (1 + CLIP_COUNT_RTOL)), dtype=dtype),
         "c_clipped": jnp.sum(mask & (ratio > c_bar * (1 + CLIP_COUNT_RTOL)), dtype=dtype),
         "rho_sum": jnp.sum(jnp.where(mask, rho, 0.0))}
  return jnp.where(mask, excess + values, 0.0), aux
