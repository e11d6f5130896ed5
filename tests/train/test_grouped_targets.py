"""`sao.train.grouped_targets` and `sao.core.masked.merge_moments`: the update's targets computed per length group and
merged equal the whole batch's (`sao.train.targets`, float64 NumPy for the moments), on random inputs and masks."""
import jax
import numpy as np
import pytest

from sao.core.masked import masked_moments, merge_moments
from sao.train import batching, grouped_targets, targets


def _moments64(x, mask):
  v = np.asarray(x, np.float64)[np.asarray(mask, bool)]
  if v.size == 0:
    return 0, 0.0, 0.0
  return v.size, v.mean(), ((v - v.mean()) ** 2).sum()


@pytest.mark.parametrize("offset", [0.0, 1e4])  # |mean| ≫ std: a one-pass Σx² − n·mean² would lose every digit
def test_merge_moments_equals_float64_over_parts_some_empty(offset):
  rng = np.random.default_rng(3)
  x = (offset + rng.normal(size=(12, 40))).astype(np.float32)
  mask = rng.random((12, 40)) < 0.4
  mask[3:6] = False  # a whole part with nothing counted
  cuts = [(0, 3), (3, 6), (6, 7), (7, 12)]
  merged = merge_moments([masked_moments(x[a:b], mask[a:b]) for a, b in cuts])
  n, mean, m2 = _moments64(x, mask)
  assert float(merged.count) == n
  np.testing.assert_allclose(float(merged.mean), mean, rtol=1e-6)
  # At 1e4 a float32 input's own rounding is 5e-4 of its std: the merge keeps the variance to 1e-3, where a one-pass
  # variance would have no correct digit.
  np.testing.assert_allclose(float(merged.var), m2 / n, rtol=1e-5 if offset == 0 else 1e-3)
  np.testing.assert_allclose(float(merged.min), x[mask].min())
  np.testing.assert_allclose(float(merged.max), x[mask].max())
  empty = merge_moments([masked_moments(x[3:6], mask[3:6])])
  assert float(empty.count) == 0 and float(empty.var) == 0
  assert all(float(v) == 0 for v in empty.summary("x").values())
  with pytest.raises(ValueError, match="no parts"):
    merge_moments([])


def _batch(rng, rows=12, length=40):
  lengths = rng.integers(1, length + 1, rows)
  lengths[0] = length
  attention = np.arange(length)[None, :] < lengths[:, None]
  action = attention & (rng.random((rows, length)) < 0.5)
  action[1] = False  # a row without an action token
  action[2] = attention[2]  # an all-action row
  rewards = rng.integers(0, 2, rows).astype(np.float32)
  token_rewards = np.zeros((rows, length), np.float32)
  for i in range(rows):
    if action[i].any():
      token_rewards[i, np.flatnonzero(action[i])[-1]] = rewards[i]
  return {"action_mask": action, "attention_mask": attention.astype(np.int32), "token_rewards": token_rewards}


def _cut(batch, values, groups):
  return ([{k: v[g.rows, :g.length] for k, v in batch.items()} for g in groups],
          [values[g.rows, :g.length] for g in groups])


@pytest.mark.parametrize("num_groups,whiten,fixed_lambda", [(4, True, 0.0), (3, False, 0.0), (1, True, 0.9),
                                                            (12, True, 0.0)])
def test_grouped_targets_equal_the_whole_batch(num_groups, whiten, fixed_lambda):
  rng = np.random.default_rng(num_groups)
  batch = _batch(rng)
  values0 = rng.normal(size=batch["action_mask"].shape).astype(np.float32)
  values1 = rng.normal(size=batch["action_mask"].shape).astype(np.float32)
  groups = batching.length_groups(batch["attention_mask"], num_groups, 1, (8, 16, 24, 32, 40))
  mask = batch["action_mask"]
  gamma, lam, alpha = 0.95, 0.9, 1.5

  # Monte-Carlo returns (λ_critic = 1).
  returns, returns_var, returns_diag = targets.monte_carlo_returns(batch, gamma)
  parts, v0_parts = _cut(batch, values0, groups)
  r_parts, stats = zip(*(grouped_targets.monte_carlo_returns(p, gamma) for p in parts))
  _, g_var, g_diag = grouped_targets.merge_returns(list(stats))
  np.testing.assert_allclose(float(g_var), float(returns_var), rtol=1e-5)
  _assert_dicts_close(g_diag, returns_diag)
  for g, r in zip(groups, r_parts):
    np.testing.assert_allclose(np.asarray(r), np.asarray(returns)[g.rows, :g.length], rtol=1e-6, atol=1e-6)

  # Targets that read V⁰ (λ_critic < 1) and their diagnostics.
  returns_v, diag_v = targets.critic_targets(batch, values0, gamma, lam)
  rv_parts, stats_v = zip(*(grouped_targets.critic_targets(p, v, gamma, lam) for p, v in zip(parts, v0_parts)))
  returns_moments, g_diag_v = grouped_targets.merge_critic_targets(list(stats_v))
  _assert_dicts_close(g_diag_v, diag_v)
  for g, r in zip(groups, rv_parts):
    np.testing.assert_allclose(np.asarray(r), np.asarray(returns_v)[g.rows, :g.length], rtol=1e-5, atol=1e-5)

  # Advantages on V¹, whitened (or not) over the whole batch, and every metric the learner logs.
  adv, adv_diag = targets.policy_advantages(batch, values1, returns_v, gamma, alpha, whiten, fixed_lambda)
  _, v1_parts = _cut(batch, values1, groups)
  a_parts, stats_a = zip(*(grouped_targets.policy_advantages(p, v, r, gamma, alpha, fixed_lambda)
                           for p, v, r in zip(parts, v1_parts, rv_parts)))
  moments, g_adv_diag = grouped_targets.merge_advantages(list(stats_a), returns_moments)
  final = [moments]
  if whiten:
    a_parts, final = zip(*(grouped_targets.whiten(a, p["action_mask"], moments) for a, p in zip(a_parts, parts)))
  g_adv_diag.update(grouped_targets.merge_final(list(final)))
  _assert_dicts_close(g_adv_diag, adv_diag)
  for g, a in zip(groups, a_parts):
    np.testing.assert_allclose(np.asarray(a), np.asarray(adv)[g.rows, :g.length], rtol=1e-5, atol=1e-5)
    assert not np.asarray(a)[~mask[g.rows, :g.length]].any()  # 0 off the action mask


def _assert_dicts_close(got, want):
  got, want = jax.device_get(got), jax.device_get(want)
  assert set(got) == set(want), set(got) ^ set(want)
  for key in want:
    np.testing.assert_allclose(float(got[key]), float(want[key]), rtol=1e-5, atol=1e-6, err_msg=key)
