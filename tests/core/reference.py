"""Plain float64 NumPy references written from the equations in docs/algorithm.md, loop by loop."""
import numpy as np


def gae(rewards, values, mask, gamma, lam):
  rewards, values = np.asarray(rewards, np.float64), np.asarray(values, np.float64)
  mask = np.asarray(mask, bool)
  batch, num_tokens = rewards.shape
  lam = np.broadcast_to(np.asarray(lam, np.float64), (batch,))
  adv = np.zeros((batch, num_tokens))
  ret = np.zeros((batch, num_tokens))
  for b in range(batch):
    next_value, last_adv = 0.0, 0.0
    for t in reversed(range(num_tokens)):
      delta = rewards[b, t] + gamma * next_value - values[b, t]
      a = delta + gamma * lam[b] * last_adv
      if mask[b, t]:
        next_value, last_adv = values[b, t], a
        adv[b, t] = a
        ret[b, t] = a + values[b, t]
  return adv, ret


def length_adaptive_lambda(mask, alpha):
  length = np.asarray(mask, bool).sum(-1).astype(np.float64)
  out = np.zeros_like(length)
  for b, l in enumerate(length):
    out[b] = 0.0 if l == 0 else min(max(1.0 - 1.0 / (alpha * l), 0.0), 1.0)
  return out


def place_terminal_reward(rewards, mask):
  mask = np.asarray(mask, bool)
  out = np.zeros(mask.shape)
  for b in range(mask.shape[0]):
    idx = np.nonzero(mask[b])[0]
    if len(idx):
      out[b, idx[-1]] = rewards[b]
  return out, mask.any(-1)


def masked_mean(x, mask):
  x, mask = np.asarray(x, np.float64), np.asarray(mask, bool)
  return x[mask].mean() if mask.any() else 0.0


def masked_var(x, mask, unbiased=False):
  x, mask = np.asarray(x, np.float64), np.asarray(mask, bool)
  n = mask.sum()
  d = n - 1 if unbiased else n
  if d <= 0:
    return 0.0
  return ((x[mask] - x[mask].mean()) ** 2).sum() / d


def masked_whiten(x, mask, eps=1e-8):
  x, mask = np.asarray(x, np.float64), np.asarray(mask, bool)
  out = (x - masked_mean(x, mask)) / np.sqrt(masked_var(x, mask) + eps)
  return np.where(mask, out, 0.0)


def group_advantages(rewards, group_ids, normalize_std=True, eps=1e-6):
  rewards = np.asarray(rewards, np.float64)
  out = np.zeros_like(rewards)
  for i, g in enumerate(group_ids):
    members = rewards[np.asarray(group_ids) == g]
    if len(members) < 2:
      continue
    out[i] = rewards[i] - members.mean()
    if normalize_std:
      out[i] /= members.std(ddof=1) + eps
  return out


def dis_loss(logp, rollout_logp, adv, mask, low, high):
  logp, rollout_logp, adv = (np.asarray(a, np.float64) for a in (logp, rollout_logp, adv))
  mask = np.asarray(mask, bool)
  total, masked = 0.0, 0
  for idx in zip(*np.nonzero(mask)):
    r = np.exp(logp[idx] - rollout_logp[idx])
    f = r if low < r < high else 0.0
    masked += f == 0.0
    total += f * adv[idx] * logp[idx]
  n = max(mask.sum(), 1)
  return -total / n, masked / n


def gspo_loss(logp, old_logp, seq_adv, mask, clip_low, clip_high):
  logp, old_logp = np.asarray(logp, np.float64), np.asarray(old_logp, np.float64)
  mask = np.asarray(mask, bool)
  objs = []
  for b in range(mask.shape[0]):
    if not mask[b].any():
      continue
    s = np.exp((logp[b] - old_logp[b])[mask[b]].mean())
    a = seq_adv[b]
    objs.append(min(s * a, np.clip(s, 1 - clip_low, 1 + clip_high) * a))
  return -sum(objs) / max(len(objs), 1)


def ppo_clip_loss(logp, old_logp, adv, mask, clip_low, clip_high):
  logp, old_logp, adv = (np.asarray(a, np.float64) for a in (logp, old_logp, adv))
  mask = np.asarray(mask, bool)
  total = 0.0
  for idx in zip(*np.nonzero(mask)):
    r = np.exp(logp[idx] - old_logp[idx])
    total += min(r * adv[idx], np.clip(r, 1 - clip_low, 1 + clip_high) * adv[idx])
  return -total / max(mask.sum(), 1)


def value_loss(values, returns, mask, old_values=None, clip=None):
  values, returns = np.asarray(values, np.float64), np.asarray(returns, np.float64)
  mask = np.asarray(mask, bool)
  total = 0.0
  for idx in zip(*np.nonzero(mask)):
    loss = 0.5 * (values[idx] - returns[idx]) ** 2
    if clip is not None:
      vc = old_values[idx] + np.clip(values[idx] - old_values[idx], -clip, clip)
      loss = max(loss, 0.5 * (vc - returns[idx]) ** 2)
    total += loss
  return total / max(mask.sum(), 1)


def explained_variance(values, returns, mask, eps=1e-8):
  var_r = masked_var(returns, mask)
  if var_r <= eps:
    return 0.0
  return 1.0 - masked_var(np.asarray(returns, np.float64) - values, mask) / var_r


def tis_loss(logp, rollout_logp, adv, mask, cap):
  """TIS: `−(1/N) Σ m·min(k, C)·A·logp`, `k = exp(logp − logp_rollout)`; also the fraction of tokens with k > C."""
  logp, rollout_logp, adv = (np.asarray(a, np.float64) for a in (logp, rollout_logp, adv))
  mask = np.asarray(mask, bool)
  total, truncated = 0.0, 0
  for idx in zip(*np.nonzero(mask)):
    k = np.exp(logp[idx] - rollout_logp[idx])
    truncated += k > cap
    total += min(k, cap) * adv[idx] * logp[idx]
  n = max(mask.sum(), 1)
  return -total / n, truncated / n


def icepop_loss(logp, rollout_logp, adv, mask, low, high):
  """IcePop: `−(1/N) Σ m·M(k)·A·logp`, `M(k) = k` for `low ≤ k ≤ high`, else 0; also the masked fraction."""
  logp, rollout_logp, adv = (np.asarray(a, np.float64) for a in (logp, rollout_logp, adv))
  mask = np.asarray(mask, bool)
  total, masked = 0.0, 0
  for idx in zip(*np.nonzero(mask)):
    k = np.exp(logp[idx] - rollout_logp[idx])
    if low <= k <= high:
      total += k * adv[idx] * logp[idx]
    else:
      masked += 1
  n = max(mask.sum(), 1)
  return -total / n, masked / n


def vtrace(rewards, values, log_ratio, mask, gamma, lam, rho_bar, c_bar):
  """V-trace targets (Espeholt et al. 2018, eq. 1 with remark 2's λ) over each row's action tokens, summed term by
  term: `v_s = V_s + Σ_{t ≥ s} γ^{t−s} (Π_{i<t} c_i) ρ_t (r_t + γ V_{t+1} − V_t)`, indices over action tokens only."""
  rewards, values, log_ratio = (np.asarray(a, np.float64) for a in (rewards, values, log_ratio))
  mask = np.asarray(mask, bool)
  out = np.zeros(rewards.shape)
  for b in range(rewards.shape[0]):
    idx = np.nonzero(mask[b])[0]
    r, v, k = rewards[b, idx], values[b, idx], np.exp(log_ratio[b, idx])
    n = len(idx)
    rho, c = np.minimum(rho_bar, k), lam * np.minimum(c_bar, k)
    for s in range(n):
      total, discount = 0.0, 1.0
      for t in range(s, n):
        next_v = v[t + 1] if t + 1 < n else 0.0
        total += discount * rho[t] * (r[t] + gamma * next_v - v[t])
        discount *= gamma * c[t]
      out[b, idx[s]] = v[s] + total
  return out
