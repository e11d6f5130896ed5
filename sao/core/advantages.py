"""Advantages for agentic RL: skip-observation GAE, per-sequence λ, reward placement, whitening, group advantages.

Notation (docs/algorithm.md): `B` sequences, `T` tokens, `m = action_mask [B, T]` with 1 on model-action tokens
(sampled by the policy) and 0 on prompt, template, tool-observation and padding tokens. Tool observations are context
the model sees, never tokens it is trained on, so GAE *bridges* them: the recursion runs over action tokens only.

All functions are pure, jit-compatible, accept float32/bfloat16 inputs and compute in float32 (float64 when an input
already is float64 under x64). Argument errors are `ValueError`s raised at trace time that name the argument.
"""
from typing import Callable, Literal, Mapping, TypeVar

import jax
import jax.numpy as jnp

from sao.core import checks
from sao.core import gae_chunked
from sao.kernels import gae_cpu
from sao.core.masked import masked_mean, masked_var, masked_whiten  # re-exported: part of this module's API

__all__ = [
    "gae",
    "whitened_gae",
    "length_adaptive_lambda",
    "place_terminal_reward",
    "masked_mean",
    "masked_var",
    "masked_whiten",
    "group_advantages",
]


def _linear_recurrence_reverse(a: jax.Array, b: jax.Array) -> jax.Array:
  """Solves `x_t = a_t · x_{t+1} + b_t` backwards over the last axis with `x_T = 0`, as a parallel scan.

  Each element is the affine map `x ↦ a·x + b`. Scanning from the end, the map for `t..T−1` is the map for `t`
  composed after the map for `t+1..T−1`: (a₁, b₁) then (a₂, b₂) gives (a₁·a₂, a₂·b₁ + b₂). Applied to `x_T = 0`, the
  accumulated `b` is `x_t`. O(log T) depth, O(T) work.
  """

  def compose(later_in_time, earlier_in_time):
    a1, b1 = later_in_time
    a2, b2 = earlier_in_time
    return a1 * a2, a2 * b1 + b2

  _, x = jax.lax.associative_scan(compose, (a, b), reverse=True, axis=a.ndim - 1)
  return x


def _gae_scan(rewards, values, mask, gamma, lam, chunk: int = 128):
  """The reference recursion of docs/algorithm.md as a two-level reverse `lax.scan`. Arrays are `[B, T]`.

  A plain scan over `T` steps of `[B]` vectors leaves the CPU/TPU vector units idle and pays the loop overhead `T`
  times. Instead `T` is cut into `K = T/L` chunks of `L = chunk` tokens and one reverse scan of `L` steps runs over
  all `B·K` chunks at once, each starting from a zero carry. The recursion is affine in the carry: with
  `h = γ·nextV + γλ·lastA` (what enters `A'_t = r_t − V_t + h`), an action token maps `h ↦ γ·V_t + γλ·A'_t`, so the
  true `A'_t = A'^{local}_t + c_t·h_in`, where `h_in` is the state entering the chunk from its right and
  `c_t = (γλ)^{#action tokens after t in its chunk}`. A second reverse scan over the `K` chunk boundaries carries
  `h_in = h^{local}_out + c_out·h_in(next chunk)`, and one elementwise pass applies the correction.
  """
  batch, num_tokens = rewards.shape
  num_chunks = -(-num_tokens // chunk)
  pad = num_chunks * chunk - num_tokens
  if pad:  # trailing observation tokens change nothing: they are bridged and their rewards ignored
    rewards, values = (jnp.pad(x, ((0, 0), (0, pad))) for x in (rewards, values))
    mask = jnp.pad(mask, ((0, 0), (0, pad)))
  gamma_lam = jnp.broadcast_to(gamma * lam, (batch, num_chunks)).reshape(-1)  # [B·K]

  def to_chunk_major(x):  # [B, T] -> [L, B·K]: one contiguous slab of all chunks' t-th tokens per scan step
    return x.reshape(batch * num_chunks, chunk).T

  def local_step(carry, xs):
    h, coef = carry  # [B·K] each
    base_t, gamma_value_t, m_t = xs
    adv = base_t + h
    out = (jnp.where(m_t, adv, 0.0), coef)
    h = jnp.where(m_t, gamma_value_t + gamma_lam * adv, h)
    coef = jnp.where(m_t, gamma_lam * coef, coef)
    return (h, coef), out

  # Everything that does not depend on the carry is computed outside the loop, vectorised over [B, T].
  xs = tuple(map(to_chunk_major, (rewards - values, gamma * values, mask)))
  zeros = jnp.zeros((batch * num_chunks,), rewards.dtype)
  # unroll=1: measured faster than unrolled bodies on XLA:CPU for these slab sizes.
  (h_out, coef_out), (local_adv, coef) = jax.lax.scan(local_step, (zeros, jnp.ones_like(zeros)), xs, reverse=True)

  def boundary_step(h_in, xs):  # over chunks, right to left; [B] vectors
    h_local, c = xs
    return h_local + c * h_in, h_in

  _, h_in = jax.lax.scan(boundary_step, jnp.zeros((batch,), rewards.dtype),
                         (h_out.reshape(batch, num_chunks).T, coef_out.reshape(batch, num_chunks).T), reverse=True)
  advantages = jnp.where(xs[2], local_adv + coef * h_in.T.reshape(1, -1), 0.0)  # [L, B·K]
  return advantages.T.reshape(batch, num_chunks * chunk)[:, :num_tokens]


def _gae_associative(rewards, values, mask, gamma, lam):
  """The same recursion as two parallel linear recurrences over time. Arrays are `[B, T]`.

  1. `u_t` = value of the first action token at or after `t` (0 if none): `u_t = (1−m_t)·u_{t+1} + m_t·V_t`.
     The next action token's value seen from `t` is then `u_{t+1}`.
  2. On action tokens `A_t = δ_t + γλ·A_next` with `δ_t = r_t + γ·u_{t+1} − V_t`; observation tokens pass the
     carried advantage through unchanged: `x_t = a_t·x_{t+1} + b_t` with `(a, b) = (γλ, δ)` where `m_t` and `(1, 0)`
     elsewhere.
  """
  m = mask.astype(values.dtype)
  first_value_from = _linear_recurrence_reverse(1.0 - m, m * values)
  next_value = jnp.concatenate([first_value_from[:, 1:], jnp.zeros_like(first_value_from[:, :1])], axis=1)
  delta = rewards + gamma * next_value - values
  gamma_lam = jnp.broadcast_to(gamma * lam, values.shape)
  a = jnp.where(mask, gamma_lam, 1.0)
  b = jnp.where(mask, delta, 0.0)
  return jnp.where(mask, _linear_recurrence_reverse(a, b), 0.0)



def _checked_gae_inputs(rewards, values, action_mask, gamma, lam):
  """`gae`'s argument checks: `(rewards, values)` `[B, T]` in the compute dtype, `mask` `[B, T]` bool, scalar
  `gamma` and `[B, 1]` `lam` in that dtype; ValueError naming the argument otherwise."""
  rewards = checks.float_array("rewards", rewards, ndim=2)
  values = checks.float_array("values", values, ndim=2)
  mask = checks.mask_array("action_mask", action_mask, ndim=2)
  checks.same_shape(["values", "rewards", "action_mask"], [values, rewards, mask])
  dtype = checks.compute_dtype(rewards, values)
  gamma = jnp.asarray(gamma, dtype)
  if gamma.ndim != 0:
    raise ValueError(f"gamma must be a scalar, got shape {gamma.shape}")
  lam = checks.per_sequence("lam", lam, values.shape[0], dtype)
  return rewards.astype(dtype), values.astype(dtype), mask, gamma, lam

Method = Literal["auto", "native", "chunked", "scan", "associative"]
METHODS = ("auto", "native", "chunked", "scan", "associative")
_Out = TypeVar("_Out")


def _row_moments(advantages, mask):
  """`[B, 3]` per-row `(n, mean, M2)` of `advantages` over `mask`, as the native kernel returns them."""
  count = jnp.sum(mask, axis=-1, dtype=advantages.dtype)
  mean = jnp.sum(jnp.where(mask, advantages, 0.0), axis=-1) / jnp.maximum(count, 1.0)
  m2 = jnp.sum(jnp.where(mask, jnp.square(advantages - mean[:, None]), 0.0), axis=-1)
  return jnp.stack([count, mean, m2], axis=-1)


@jax.custom_vjp
def _native_gae(rewards, values, mask, gamma, lam):
  """The native kernel's `(A, R, per-row moments)` for checked inputs (`lam` `[B, 1]`). The kernel has no
  derivative of its own: the chunked formulation's, the same linear function of rewards and values, stands in."""
  return gae_cpu.advantages_returns_and_moments(rewards, values, mask, gamma, (gamma * lam)[:, 0])


def _chunked_gae_and_row_moments(rewards, values, mask, gamma, lam):
  advantages, returns = gae(rewards, values, mask, gamma, lam[:, 0], method="chunked")
  return advantages, returns, _row_moments(advantages, mask)


def _native_gae_fwd(*primals):
  return _native_gae(*primals), primals


def _native_gae_bwd(primals, cotangents):
  return jax.vjp(_chunked_gae_and_row_moments, *primals)[1](cotangents)


_native_gae.defvjp(_native_gae_fwd, _native_gae_bwd)


def _native_or(xla_branch, dtype, native_branch):
  """`native_branch()` where the program runs on XLA:CPU and the native kernel is built (float32), else
  `xla_branch()`. The choice is `jax.lax.platform_dependent`'s, made when the program is lowered, so a program
  traced here and compiled for a TPU (ahead of time, `experiments/compile_tpu.py`) runs the XLA formulation there.
  Hosts whose default backend is not the CPU never build the kernel."""
  if dtype == jnp.float32 and jax.default_backend() == "cpu" and gae_cpu.available():
    return jax.lax.platform_dependent(cpu=native_branch, default=xla_branch)
  return xla_branch()


def _check_method(method: str) -> None:
  if method not in METHODS:
    raise ValueError(f"method must be one of {METHODS}, got {method!r}")


def _by_method(method: Method, dtype, branches: Mapping[str, Callable[[], _Out]]) -> _Out:
  """`branches[method]()`, one branch per method but "auto": that is the native branch where the program runs on
  XLA:CPU and the kernel builds, the chunked one elsewhere (`_native_or`)."""
  if method == "auto":
    return _native_or(branches["chunked"], dtype, branches["native"])
  return branches[method]()


def gae(
    rewards: jax.Array,
    values: jax.Array,
    action_mask: jax.Array,
    gamma: float | jax.Array,
    lam: float | jax.Array,
    method: Method = "auto",
) -> tuple[jax.Array, jax.Array]:
  """Skip-observation generalized advantage estimation.

  From `nextV = 0, lastA = 0`, for `t = T−1 … 0`:

      δ_t = r_t + γ·nextV − V_t
      A'_t = δ_t + γ·λ_b·lastA
      if m_t:  nextV = V_t;  lastA = A'_t

  and `A_t = m_t·A'_t`, `R_t = m_t·(A'_t + V_t)`. Observation tokens (`m_t = 0`) are bridged: they neither consume
  a discount step nor contribute their value, and their rewards are ignored (put outcome rewards on the last action
  token with `place_terminal_reward`). Same recursion as verl's `compute_gae_advantage_return` with a response mask.

  Args:
    rewards: `[B, T]` per-token rewards.
    values: `[B, T]` critic values.
    action_mask: `[B, T]` bool/int, 1 on model-action tokens.
    gamma: scalar discount γ.
    lam: scalar λ or per-sequence `[B]` (e.g. from `length_adaptive_lambda`).
    method: "auto" (the default: "native" for float32 on XLA:CPU where the kernel builds, "chunked" elsewhere,
      chosen per platform when the program is lowered), "native" (`sao.kernels.gae_cpu`: one pass over the tokens
      in a C++ kernel, XLA:CPU and float32 only, exact for every γλ), "chunked" (chunk-local triangular matmuls plus
      a scan over chunk boundaries, `sao.core.gae_chunked`; the fastest XLA formulation, and it falls back to
      "scan" for a batch with a sequence whose γλ is outside `[gae_chunked.G_MIN, 1/G_MIN]`, e.g. λ = 0), "scan"
      (two-level reverse `lax.scan`, the reference) or "associative" (parallel scan). They agree to float
      rounding.

  Returns:
    `(advantages, returns)`, both `[B, T]` in the compute dtype (float32 for float32/bfloat16 inputs), 0 where `m == 0`.
  """
  _check_method(method)
  rewards, values, mask, gamma, lam = _checked_gae_inputs(rewards, values, action_mask, gamma, lam)

  def with_returns(advantages):
    return advantages, jnp.where(mask, advantages + values, 0.0)

  def native():
    advantages, returns, _ = _native_gae(rewards, values, mask, gamma, lam)
    return advantages, returns

  def chunked():
    gamma_lam = (gamma * lam)[:, 0]  # [B]
    return jax.lax.cond(gae_chunked.fits(gamma_lam, mask),
                        lambda: gae_chunked.advantages_and_returns(rewards, values, mask, gamma, gamma_lam),
                        lambda: with_returns(_gae_scan(rewards, values, mask, gamma, lam)))

  return _by_method(method, rewards.dtype, {
      "native": native, "chunked": chunked,
      "scan": lambda: with_returns(_gae_scan(rewards, values, mask, gamma, lam)),
      "associative": lambda: with_returns(_gae_associative(rewards, values, mask, gamma, lam))})


def whitened_gae(
    rewards: jax.Array,
    values: jax.Array,
    action_mask: jax.Array,
    gamma: float | jax.Array,
    lam: float | jax.Array,
    method: Method = "auto",
    eps: float = 1e-8,
) -> tuple[jax.Array, jax.Array]:
  """`(masked_whiten(A, m, eps), R)` with `(A, R) = gae(...)`: GAE and batch whitening of its advantages.

  Equal to the two calls to float rounding; with the "native" and "chunked" methods (the latter when the batch
  fits, see `gae`) the masked mean and variance of `A` come out of GAE's own pass over the time axis (per row from
  `sao.kernels.gae_cpu`, per row group from `gae_chunked.advantages_returns_and_moments`), so whitening reads the
  advantages once instead of three times.

  Args: as `gae`, plus `eps`, added to the variance as in `masked_whiten`.

  Returns:
    `(whitened_advantages, returns)`, both `[B, T]` in the compute dtype, 0 where `m == 0`. The returns are not
    whitened (they are the critic's targets).
  """
  _check_method(method)
  rewards, values, mask, gamma, lam = _checked_gae_inputs(rewards, values, action_mask, gamma, lam)
  gamma_lam = (gamma * lam)[:, 0]  # [B]

  def whiten(advantages, returns, count, mean, sum_sq):
    var = jnp.where(count > 0, sum_sq / jnp.maximum(count, 1.0), 0.0)  # population variance, as masked_var
    return jnp.where(mask, (advantages - mean) * jax.lax.rsqrt(var + eps), 0.0), returns

  def native():
    advantages, returns, row_moments = _native_gae(rewards, values, mask, gamma, lam)
    return whiten(advantages, returns, *gae_cpu.merge_row_moments(row_moments))

  def fused():
    advantages, returns, moments = gae_chunked.advantages_returns_and_moments(rewards, values, mask, gamma,
                                                                               gamma_lam)
    return whiten(advantages, returns, *moments)

  def unfused(advantages_of):  # GAE, then whitening's own passes over the advantages
    advantages = advantages_of(rewards, values, mask, gamma, lam)
    return masked_whiten(advantages, mask, eps), jnp.where(mask, advantages + values, 0.0)

  def chunked():
    return jax.lax.cond(gae_chunked.fits(gamma_lam, mask), fused, lambda: unfused(_gae_scan))

  return _by_method(method, rewards.dtype, {"native": native, "chunked": chunked,
                                            "scan": lambda: unfused(_gae_scan),
                                            "associative": lambda: unfused(_gae_associative)})


def _action_counts(mask: jax.Array) -> jax.Array:
  """`[B]` float32 `Σ_t m_t`, exact below 2^24 tokens per row.

  On XLA:CPU, with T a multiple of 4, four mask bytes (0 or 1 each) are read as one uint32 and counted with a popcount:
  one pass over the mask at a quarter of the elements, 1.5-2x faster than the float32 sum at 256x16384
  (docs/performance_learner.md). The float32 sum runs elsewhere: XLA:CPU fuses it into the reduction, while an integer
  sum first writes the mask out as int32."""
  batch, num_tokens = mask.shape
  if num_tokens >= 2 ** 24:
    return jnp.sum(mask, axis=-1).astype(jnp.float32)

  def float_sum():
    return jnp.sum(mask, axis=-1, dtype=jnp.float32)

  if num_tokens % 4:
    return float_sum()

  def popcount():
    words = jax.lax.bitcast_convert_type(mask.astype(jnp.uint8).reshape(batch, num_tokens // 4, 4), jnp.uint32)
    return jnp.sum(jax.lax.population_count(words), axis=-1, dtype=jnp.int32).astype(jnp.float32)

  return jax.lax.platform_dependent(cpu=popcount, default=float_sum)


def length_adaptive_lambda(action_mask: jax.Array, alpha: float = 1.5) -> jax.Array:
  """VAPO's length-adaptive policy λ: `λ_b = 1 − 1/(α·l_b)`, `l_b` = number of action tokens in sequence `b`.

  Longer trajectories get λ closer to 1 (less bias, the variance is averaged over more tokens). The result is
  clipped to `[0, 1]`; a sequence with no action token (`l = 0`) gets `λ = 0` — its advantages are all zero anyway.

  Args:
    action_mask: `[B, T]` bool/int.
    alpha: α > 0.

  Returns:
    `[B]` float32 λ.
  """
  mask = checks.mask_array("action_mask", action_mask, ndim=2)
  if not alpha > 0:
    raise ValueError(f"alpha must be positive, got {alpha}")
  length = _action_counts(mask)
  lam = 1.0 - 1.0 / (alpha * jnp.maximum(length, 1.0))
  return jnp.where(length > 0, jnp.clip(lam, 0.0, 1.0), 0.0)


def place_terminal_reward(rewards: jax.Array, action_mask: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Puts each sequence's scalar outcome reward on its last model-action token.

  Agent trajectories usually end with a tool observation; a reward placed on the last *token* would never reach
  GAE, which skips observations.

  Args:
    rewards: `[B]` outcome rewards.
    action_mask: `[B, T]` bool/int.

  Returns:
    `(token_rewards [B, T], has_action [B] bool)`: `token_rewards[b]` is zero except at the last action token.
    A sequence with no action token gets no reward anywhere and `has_action = False`; callers should drop it.
  """
  rewards = checks.float_array("rewards", rewards, ndim=1)
  mask = checks.mask_array("action_mask", action_mask, ndim=2)
  if rewards.shape[0] != mask.shape[0]:
    raise ValueError(f"rewards has shape {rewards.shape} but action_mask has {mask.shape[0]} rows")
  num_tokens = mask.shape[1]
  has_action = jnp.any(mask, axis=-1)
  last = num_tokens - 1 - jnp.argmax(mask[:, ::-1], axis=-1)  # [B]
  at_last = (jnp.arange(num_tokens)[None, :] == last[:, None]) & has_action[:, None]
  dtype = checks.compute_dtype(rewards)
  return jnp.where(at_last, rewards.astype(dtype)[:, None], 0.0), has_action


def group_advantages(
    rewards: jax.Array,
    group_ids: jax.Array,
    normalize_std: bool = True,
    eps: float = 1e-6,
) -> jax.Array:
  """GRPO-style group-relative advantages: `Â_i = (r_i − mean_g r) / (std_g r + eps)`.

  `std_g` is the sample standard deviation (Bessel-corrected, as GRPO implementations use). With
  `normalize_std=False` this is Dr. GRPO: `Â_i = r_i − mean_g r`. A group of one gets 0. Groups need not be
  contiguous; O(B²) memory, fine for batch sizes of thousands.

  Args:
    rewards: `[B]` scalar rewards.
    group_ids: `[B]` integer group ids (samples of one task share an id).

  Returns:
    `[B]` advantages in the compute dtype.
  """
  rewards = checks.float_array("rewards", rewards, ndim=1)
  group_ids = jnp.asarray(group_ids)
  if not jnp.issubdtype(group_ids.dtype, jnp.integer):
    raise ValueError(f"group_ids must be an integer array, got dtype {group_ids.dtype}")
  checks.same_shape(["rewards", "group_ids"], [rewards, group_ids])
  r = rewards.astype(checks.compute_dtype(rewards))
  member = group_ids[:, None] == group_ids[None, :]  # [B, B]
  same = member.astype(r.dtype)
  count = jnp.sum(same, axis=1)
  # Shift each group by its minimum (an exact member value) first: a group of equal rewards then centres to exact
  # zeros instead of rounding noise that the std division would blow up to O(1) advantages.
  r = r - jnp.min(jnp.where(member, r[None, :], jnp.inf), axis=1)
  mean = same @ r / count
  centred = r - mean
  adv = centred
  if normalize_std:
    # Σ_j∈g (r_j − mean_g)² computed per row i through the group-membership matrix.
    sum_sq = jnp.sum(same * (r[None, :] - mean[:, None]) ** 2, axis=1)
    std = jnp.sqrt(sum_sq / jnp.maximum(count - 1.0, 1.0))
    adv = centred / (std + eps)
  return jnp.where(count > 1, adv, 0.0)
