"""Off-policy-corrected critic targets (`sao.critic_target_correction`), for the one-call and the grouped update.

    "none"    R = GAE(r, V⁰, γ, λ_critic) + V⁰                      (`sao.train.targets.critic_targets`, today's)
    "vtrace"  R = V-trace(r, V⁰, k = π_θ/π_rollout; γ, λ_critic, ρ̄, c̄)   (`sao.core.vtrace.vtrace_returns`)

π_θ is the actor before this update (its forward on the batch, `Learner.actor_logprobs`), π_rollout the engine's
log-probs each trajectory carries, so `k` folds both staleness (the policy moved since the sample) and the
engine/trainer numerical mismatch into the targets. V-trace reads V⁰, so with it on the update always runs the
pre-update critic forward (`targets.critic_reads_values_before`). Every program here is a `mesh_jit.program`, so a
multi-process job records and runs them like the other target programs; the update plan
(`sao.train.update_plan`) names the correction, so processes that would run different programs refuse to start.

Metrics (V-trace only): `critic/vtrace_rho_clipped_fraction` and `critic/vtrace_c_clipped_fraction` (action tokens
with k above ρ̄, c̄) and `critic/vtrace_rho_mean`, beside the diagnostics `critic_targets` reports.
"""
from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp

from sao.core import metrics as metrics_lib
from sao.core import vtrace
from sao.core.masked import Moments, masked_moments
from sao.train import grouped_targets, mesh_jit, steps, targets

# pylint: disable=protected-access  (the learner's own states and programs: this module computes its targets)


def _vtrace(batch, values, logprobs, gamma, lam, rho_bar, c_bar):
  mask = batch["action_mask"]
  log_ratio = logprobs - batch["rollout_logprobs"]
  return vtrace.vtrace_returns(batch["token_rewards"], values, log_ratio, mask, gamma, lam, rho_bar, c_bar)


def _clip_metrics(aux: dict[str, jax.Array]) -> dict[str, jax.Array]:
  tokens = jnp.maximum(aux["tokens"], 1.0)
  return {"critic/vtrace_rho_clipped_fraction": aux["rho_clipped"] / tokens,
          "critic/vtrace_c_clipped_fraction": aux["c_clipped"] / tokens,
          "critic/vtrace_rho_mean": aux["rho_sum"] / tokens}


@mesh_jit.program(static_argnums=(3, 4, 5, 6))
def vtrace_targets(batch, values, logprobs, gamma: float, lam: float, rho_bar: float, c_bar: float):
  """V-trace `R` `[B, T]` and `targets.critic_targets`' diagnostics plus the clip fractions."""
  mask = batch["action_mask"]
  returns, aux = _vtrace(batch, values, logprobs, gamma, lam, rho_bar, c_bar)
  diag = {"critic/explained_variance": metrics_lib.explained_variance(values, returns, mask),
          **metrics_lib.masked_summary("critic/values", values, mask),
          **metrics_lib.masked_summary("critic/returns", returns, mask), **_clip_metrics(aux)}
  return returns, diag


@mesh_jit.program(static_argnums=(3, 4, 5, 6))
def grouped_vtrace_targets(part, values, logprobs, gamma: float, lam: float, rho_bar: float, c_bar: float):
  """A length group's V-trace `R_g` and the statistics `grouped_targets.merge_critic_targets` merges (moments of
  V⁰, R, R − V⁰), plus the group's clip counts."""
  mask = part["action_mask"]
  returns, aux = _vtrace(part, values, logprobs, gamma, lam, rho_bar, c_bar)
  return returns, ({"values": masked_moments(values, mask), "returns": masked_moments(returns, mask),
                    "residual": masked_moments(returns - values, mask)}, aux)


@mesh_jit.program
def merge_clip_counts(parts: Sequence[dict[str, jax.Array]]) -> dict[str, jax.Array]:
  """The groups' V-trace counts → the batch's clip fractions."""
  return _clip_metrics({k: sum(p[k] for p in parts) for k in parts[0]})


def _policy_logprobs(learner: Any, batch: dict) -> jax.Array:
  """The actor's log-probs `[B, T]` before this update (one forward)."""
  return learner.actor_logprobs(learner.actor.state.params,
                                steps.select(batch, ("input_ids", "attention_mask"), "critic targets"))[0]


def critic_targets(learner: Any, batch: dict, values_before: jax.Array) -> tuple[jax.Array, dict[str, jax.Array]]:
  """`(R, diagnostics)` of the one-call update on the device batch, per `sao.critic_target_correction`."""
  c = learner.config.sao
  if c.critic_target_correction == "none":
    return targets.critic_targets(batch, values_before, c.gamma, c.lambda_critic)
  return vtrace_targets(batch, values_before, _policy_logprobs(learner, batch), c.gamma, c.lambda_critic,
                        c.vtrace_rho_bar, c.vtrace_c_bar)


def grouped_critic_targets(learner: Any, parts: list[dict], values_before: list[jax.Array]
                           ) -> tuple[list[jax.Array], Moments, dict[str, jax.Array]]:
  """`(R per group, R's merged moments, diagnostics)` of the grouped update, per `sao.critic_target_correction`."""
  c = learner.config.sao
  if c.critic_target_correction == "none":
    returns, stats = zip(*(grouped_targets.critic_targets(p, v, c.gamma, c.lambda_critic)
                           for p, v in zip(parts, values_before)))
    return (list(returns), *grouped_targets.merge_critic_targets(list(stats)))
  returns, stats, counts = [], [], []
  for part, values in zip(parts, values_before):
    r, (s, aux) = grouped_vtrace_targets(part, values, _policy_logprobs(learner, part), c.gamma, c.lambda_critic,
                                         c.vtrace_rho_bar, c.vtrace_c_bar)
    returns.append(r)
    stats.append(s)
    counts.append(aux)
  returns_moments, diag = grouped_targets.merge_critic_targets(stats)
  return returns, returns_moments, {**diag, **merge_clip_counts(counts)}
