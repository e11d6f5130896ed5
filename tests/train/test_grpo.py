"""GRPO: one learner update against a plain float64 NumPy reference, and the shipped config's recipe.

The reference is written from docs/algorithm.md ("GRPO"), loop by loop, from the trajectories themselves (not from the
learner's batch fields): per group of one task `Â = (R − mean_g R)/(std_g R + 1e-6)` with the Bessel-corrected std
(a group of one, or of equal rewards, gets 0), then the token-level clipped surrogate with token-mean aggregation

    L = −(1/N) Σ_{b,t} m_{b,t} min(r_t Â_b, clip(r_t, 1 − ε, 1 + ε) Â_b),   r_t = exp(logp_θ − logp_old),

whose derivative w.r.t. a token's log-prob is `−r_t Â_b / N` where the unclipped term is the minimum and 0 where the
clip binds. The batch has groups of mixed, continuous and equal rewards, a group of one, and padding rows.
"""
from __future__ import annotations

import jax
import numpy as np
import pytest

from experiments.configs import grpo_openswe
from sao.train import steps
from sao.transport.trajectory import Trajectory
from tests.train import helpers

EPS = 0.2  # the recipe's ε (docs/algorithm.md)
# Rewards per group: mixed binary, continuous, all equal (Â = 0), all failed (Â = 0), a group of one (Â = 0).
GROUP_REWARDS = {"mixed": (1.0, 0.0, 0.0, 1.0), "graded": (0.3, 0.9, 0.1, 0.5), "solved": (1.0, 1.0, 1.0, 1.0),
                 "failed": (0.0, 0.0, 0.0, 0.0), "alone": (1.0,)}
PAD_BATCH_TO = 24  # 17 trajectories + 7 padding rows


def _group_trajectories(seed: int, group_rewards=GROUP_REWARDS) -> list[Trajectory]:
  """Random multi-turn-looking trajectories of varied lengths (two action spans each), groups interleaved."""
  rng = np.random.default_rng(seed)
  members = [(g, i, r) for g, rewards in group_rewards.items() for i, r in enumerate(rewards)]
  members = [members[k] for k in rng.permutation(len(members))]  # groups need not be contiguous
  out = []
  for group, index, reward in members:
    length = int(rng.integers(8, 17))
    mask = np.zeros(length, bool)
    mask[2:length // 2] = True
    mask[length // 2 + 2:] = True
    out.append(Trajectory(task_id=f"{group}-{index}", token_ids=rng.integers(1, helpers.VOCAB, length),
                          action_mask=mask, rollout_logprobs=np.where(mask, -4.0, 0.0).astype(np.float32),
                          reward=reward, group_id=group, policy_version=0))
  return out


def reference_group_advantages(trajectories: list[Trajectory], eps: float = 1e-6) -> np.ndarray:
  out = np.zeros(len(trajectories))
  for i, traj in enumerate(trajectories):
    rewards = np.array([t.reward for t in trajectories if t.group_id == traj.group_id], np.float64)
    if len(rewards) > 1:
      out[i] = (traj.reward - rewards.mean()) / (rewards.std(ddof=1) + eps)
  return out


def reference_ppo_clip(logp, old_logp, seq_adv, mask, clip_low, clip_high):
  """(loss, dL/dlogp [B, T], clip fraction), float64, one token at a time."""
  logp, old_logp = np.asarray(logp, np.float64), np.asarray(old_logp, np.float64)
  mask = np.asarray(mask, bool)
  n = max(mask.sum(), 1)
  total, clipped = 0.0, 0
  grad = np.zeros(logp.shape)
  for b, t in zip(*np.nonzero(mask)):
    r, a = np.exp(logp[b, t] - old_logp[b, t]), seq_adv[b]
    unclipped, clipped_obj = r * a, min(max(r, 1 - clip_low), 1 + clip_high) * a
    total += min(unclipped, clipped_obj)
    if clipped_obj < unclipped:
      clipped += 1  # the clip binds: constant in θ
    else:
      grad[b, t] = -r * a / n
  return -total / n, grad, clipped / n


@pytest.mark.parametrize("ratio_base", ["trainer", "rollout"])
def test_grpo_update_matches_numpy_reference(ratio_base):
  learner = helpers.make_learner(**{"algorithm": "grpo", "ratio_base": ratio_base, "ppo.clip_low": EPS,
                                    "ppo.clip_high": EPS, "batching.pad_batch_to": PAD_BATCH_TO,
                                    "actor.optimizer.clip_norm": 0.0})
  trajectories = _group_trajectories(seed=3)
  batch, stats = learner.make_batch(trajectories)
  assert stats.num_padding_rows == PAD_BATCH_TO - len(trajectories) > 0
  rows = [trajectories[i] for i in stats.source_indices]  # batch row i's trajectory
  logprobs = np.asarray(learner.policy_logprobs(batch)[0], np.float64)
  mask = batch["action_mask"]
  if ratio_base == "rollout":
    # The engine's log-probs off the trainer's by up to ±0.5 nats: ratios on both sides of (1 − ε, 1 + ε).
    noise = np.random.default_rng(7).uniform(-0.5, 0.5, logprobs.shape)
    batch["rollout_logprobs"] = np.where(mask, logprobs + noise, 0.0).astype(np.float32)
    old = batch["rollout_logprobs"]
  else:
    old = logprobs  # π_old is π_θ before the update: every ratio is 1
  seq_adv = np.zeros(len(batch["valid"]))
  seq_adv[:len(rows)] = reference_group_advantages(rows)
  assert np.sum(seq_adv != 0) == 8, "only the mixed and graded groups carry advantages"
  ratios = np.exp(logprobs - old)[mask]
  # No ratio within float32 reach of a clip boundary, so the learner clips exactly the reference's tokens on any CPU.
  assert np.min(np.abs(ratios[:, None] - np.array([1 - EPS, 1 + EPS]))) > 1e-4
  loss, dloss_dlogp, clip_fraction = reference_ppo_clip(logprobs, old, seq_adv, mask, EPS, EPS)
  # The reference's per-token derivative pulled back through the learner's own forward pass: ∇θ L.
  params = jax.device_get(learner.actor_params)
  device_batch = {k: batch[k] for k in ("input_ids", "attention_mask")}
  _, pullback = jax.vjp(lambda p: steps.policy_logprobs(p, helpers.model_config(), device_batch, 1.0, 128)[0], params)
  (grad,) = pullback(dloss_dlogp.astype(np.float32))

  metrics = learner.update(batch)

  assert metrics["learner/version"] == learner.version == 1 and metrics["actor/skipped"] == 0
  np.testing.assert_allclose(metrics["actor/loss"], loss, rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(metrics["actor/clip_fraction"], clip_fraction, atol=0.5 / mask.sum())
  if ratio_base == "rollout":
    assert 0.05 < clip_fraction < 0.6, clip_fraction  # the clip binds on some tokens, not all
  else:
    assert clip_fraction == 0.0  # ratio 1 everywhere: plain REINFORCE with the group baseline
  valid_adv = seq_adv[:len(rows)]
  np.testing.assert_allclose(metrics["advantages/mean"], valid_adv.mean(), atol=1e-5)
  np.testing.assert_allclose(metrics["advantages/std"], valid_adv.std(), rtol=1e-4)
  grad_norm = np.sqrt(sum(np.sum(np.square(g, dtype=np.float64)) for g in jax.tree.leaves(grad)))
  assert grad_norm > 1e-4
  np.testing.assert_allclose(metrics["actor/grad_norm"], grad_norm, rtol=1e-3)
  # Adam's first step moves every parameter by −lr·g/(|g| + eps): against the sign of the reference gradient.
  after = jax.device_get(learner.actor_params)
  largest = max(np.abs(g).max() for g in jax.tree.leaves(grad))
  checked = 0
  for g, before, new in zip(jax.tree.leaves(grad), jax.tree.leaves(params), jax.tree.leaves(after)):
    g, step = np.asarray(g), np.asarray(new, np.float64) - np.asarray(before, np.float64)
    clear = np.abs(g) > 1e-3 * largest  # well above float32 noise: the sign cannot depend on summation order
    assert np.array_equal(np.sign(step[clear]), -np.sign(g[clear]))
    checked += clear.sum()
  assert checked > 1000, checked


def test_grpo_groups_with_equal_rewards_leave_the_policy_unchanged():
  """Equal rewards within every group (and a group of one, and padding rows): Â = 0 exactly, a zero gradient."""
  learner = helpers.make_learner(**{"algorithm": "grpo", "batching.pad_batch_to": PAD_BATCH_TO})
  equal = {k: v for k, v in GROUP_REWARDS.items() if k in ("solved", "failed", "alone")}
  batch, stats = learner.make_batch(_group_trajectories(seed=5, group_rewards=equal))
  assert stats.num_padding_rows > 0
  before = jax.device_get(learner.actor_params)
  metrics = learner.update(batch)
  assert metrics["actor/grad_norm"] == 0.0 and metrics["advantages/std"] == 0.0 and metrics["actor/skipped"] == 0
  assert helpers.tree_equal(jax.device_get(learner.actor_params), before)


@pytest.mark.parametrize("variant", ["toy", "full"])
def test_grpo_config_is_the_documented_recipe(variant):
  config = grpo_openswe.get_config(variant)
  c = config.learner
  assert c.algorithm == "grpo" and c.actor_loss == "" and c.group.normalize_std  # ppo_clip, std-normalised Â
  assert (c.ppo.clip_low, c.ppo.clip_high) == (EPS, EPS) and c.actor.optimizer.clip_norm == 1.0
  assert config.recipe.value_pretrain_steps == 0 and config.rollout.group_size == 8
  assert config.rollout.batch_size % config.rollout.group_size == 0
  assert config.rollout.batch_size == {"toy": 64, "full": 512}[variant]
  assert (c.actor.optimizer.learning_rate, c.actor.optimizer.schedule) == (
      {"toy": 2e-4, "full": 1e-6}[variant], "constant")
