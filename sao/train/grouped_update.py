"""A learner's update over its batch cut into length groups (`batching.length_groups`), the batch cut once.

The host batch is cut into groups `[b_g, T_g]` (rows sorted by length, each group padded to its own bucket) and
copied to the device once; every per-token array of the update stays in that layout — the critic's values, its
targets, the advantages, the steps' batches — and the statistics that span the batch (whitening, the metrics) are
merged from the groups' (`sao.train.grouped_targets`). Nothing comes back to the host until the metrics at the end,
so the host queues the whole update while XLA runs it: the same update as `Learner._update_sao` /
`_update_group` on the padded `[B, T]` batch (tests/train/test_learner_length_groups.py), on fewer padded tokens.

`Learner.update_traced` calls `sao_update` / `group_update` when `batching.length_groups` is set.
"""
from __future__ import annotations

from typing import Any, Iterable, Sequence

import jax
import numpy as np

from sao.train import batching, critic_correction, distributed, grouped_targets, steps, targets

# pylint: disable=protected-access  (the learner's own states, steps and rng: this module is its grouped update)


def cut(learner: Any, batch: dict[str, np.ndarray], groups: Sequence[batching.LengthGroup]) -> list[dict]:
  """The host batch's `batching.fields` as one device batch per group: `batch[k][rows, :T_g]` (`[b_g]` per row)."""
  keys = batching.fields(batch)
  host = {k: np.asarray(batch[k]) for k in keys}
  return [learner._device({k: v[g.rows, :g.length] if v.ndim >= 2 else v[g.rows] for k, v in host.items()}, keys)
          for g in groups]


def uncut(per_group: dict[str, list[jax.Array]], groups: Sequence[batching.LengthGroup],
          shape: tuple[int, int]) -> dict[str, np.ndarray]:
  """Per-group `[b_g, T_g]` arrays back into `[B, T]` host arrays (0 beyond each group's length)."""
  out = {}
  for key, parts in distributed.fetch(per_group).items():
    whole = np.zeros(shape, np.float32)
    for group, part in zip(groups, parts):
      whole[group.rows, :group.length] = np.asarray(part, np.float32)
    out[key] = whole
  return out


def sao_update(learner: Any, parts: list[dict], mask: np.ndarray, want_values_before: bool
               ) -> tuple[dict[str, jax.Array], dict[str, list[jax.Array]]]:
  """`Learner._update_sao` on the groups `parts` (`mask`: the whole batch's host action mask `[B, T]`, for the
  steps' denominators). Returns (metrics, per-token arrays as lists over the groups)."""
  c = learner.config.sao
  metrics: dict[str, jax.Array] = {}
  fused = not (want_values_before or targets.critic_reads_values_before(learner.config))
  values_before = None
  if fused:
    returns, stats = _unzip(grouped_targets.monte_carlo_returns(p, c.gamma) for p in parts)
    returns_moments, returns_var, critic_diag = grouped_targets.merge_returns(stats)
  else:
    values_before = values(learner, parts)
    returns, returns_moments, critic_diag = critic_correction.grouped_critic_targets(learner, parts, values_before)
  metrics.update(critic_diag)
  critic_parts = [dict(steps.select(p, ("input_ids", "attention_mask", "action_mask"), "critic"), returns=r,
                       old_values=v)  # old_values: unread without a clip
                  for p, r, v in zip(parts, returns, values_before or returns)]
  learner._critic_epochs(
      lambda: learner._grouped_critic_step(learner.critic.state, critic_parts, learner._next_rng(), mask), metrics,
      returns_var if fused else None)
  after = values(learner, parts)
  advantages, stats = _unzip(grouped_targets.policy_advantages(p, v, r, c.gamma, c.lambda_policy_alpha,
                                                               c.lambda_policy)
                             for p, v, r in zip(parts, after, returns))
  advantage_moments, adv_diag = grouped_targets.merge_advantages(stats, returns_moments)
  metrics.update(adv_diag)
  final = [advantage_moments]
  if c.whiten_advantages:
    advantages, final = _unzip(grouped_targets.whiten(a, p["action_mask"], advantage_moments)
                               for a, p in zip(advantages, parts))
  metrics.update(grouped_targets.merge_final(final))
  actor_steps = learner.actor_start.decide(learner.num_updates)
  if actor_steps:
    metrics.update(actor_update(learner, [dict(p, advantages=a) for p, a in zip(parts, advantages)], mask))
  metrics["actor/warmup"] = np.float32(not actor_steps)
  per_token = {"returns": returns, "advantages": advantages}
  if values_before is not None:
    per_token["values"] = values_before
  return metrics, per_token


def group_update(learner: Any, batch: dict[str, np.ndarray], parts: list[dict],
                 groups: Sequence[batching.LengthGroup], mask: np.ndarray) -> dict[str, jax.Array]:
  """`Learner._update_group` on the groups: `Â_i` over the whole batch's per-row fields (a GSPO group of samples
  spans length groups), then each length group's rows of it, gathered on the device."""
  keys = ("rewards", "group_ids", "valid")
  seq_advantages, metrics = targets.group_advantages(learner._device(batch, keys), learner.config.group.normalize_std)
  parts = [dict(p, seq_advantages=learner._take_rows(seq_advantages, g.rows)) for p, g in zip(parts, groups)]
  metrics.update(actor_update(learner, parts, mask))
  return metrics


def actor_update(learner: Any, parts: list[dict], mask: np.ndarray) -> dict[str, jax.Array]:
  """One grouped step of the configured actor loss on the fields it reads."""
  loss = learner.actor_loss
  parts = [steps.select(p, loss.batch_keys, f"actor loss {loss.name!r}") for p in parts]
  learner.actor.state, m = learner._grouped_actor_step(learner.actor.state, parts, learner._next_rng(), mask)
  return {f"actor/{k}": v for k, v in m.items()}


def values(learner: Any, parts: list[dict]) -> list[jax.Array]:
  """The critic's values `[b_g, T_g]` of each group (one forward each)."""
  params = learner.critic.state.params
  return [learner._critic_values(params, steps.select(p, ("input_ids", "attention_mask"), "critic values"))
          for p in parts]


def _unzip(pairs: Iterable[tuple[Any, Any]]) -> tuple[list[Any], list[Any]]:
  """`[(a, b), ...]` → `([a, ...], [b, ...])`: what a per-group program returns, over the groups."""
  firsts, seconds = zip(*pairs)
  return list(firsts), list(seconds)
