"""Gated DeltaNet linear attention (the `linear_attn` block of Qwen3-Next / Qwen3.5): kernels and the flax module.

The gated delta rule, per value head, with state S: [Dk, Dv] (float32), for token t (q_t, k_t L2-normalised and
q_t scaled by Dk^-1/2, decay g_t <= 0 in log space, write strength β_t in (0, 1)):
  S_t = exp(g_t) · (I − β_t k_t k_tᵀ) · S_{t−1} + β_t k_t v_tᵀ,       o_t = S_tᵀ q_t.
A token with g_t = 0 and β_t = 0 leaves S unchanged: padding tokens are given exactly that, so they are no-ops.

Two forms that agree (tests/models/test_gated_deltanet.py):
  * `recurrent_gated_delta_rule`: a `lax.scan` over tokens (decoding, and the reference).
  * `chunked_gated_delta_rule`: the parallel form of Yang et al. (2024, "Gated Delta Networks") as in HF's
    pure-torch fallback: inside each chunk of C tokens everything is matrix products (a unit lower-triangular solve
    builds the WY form of the C delta updates), and a `lax.scan` over chunks carries S.

The chunked form's matmuls run in one of two precisions (`ModelConfig.linear_attn_matmul`): "float32" (f32 operands
at HIGHEST precision — 6 bf16 passes on a TPU — the oracle) or "bfloat16" (bf16 operands, f32 accumulation, and the
chunk inputs of the scan stored in bf16, as flash-linear-attention's kernels compute it); either way the state S is
carried in f32 and the WY solve's unit-lower inverse is built in f32.
"""
from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from sao.models import sequence_parallel
from sao.models.config import ModelConfig
from sao.models.layers import Linear, dtypes, kernel_init, linear_init, linear_matmul
from sao.models.wy_solve import _HIGHEST, MATMUL_DTYPES, chunk_matmul, solve_unit_lower

Array = jax.Array

def l2_normalize(x: Array, eps: float = 1e-6) -> Array:
  """`x / sqrt(Σ x² + eps)` over the last axis, in float32 (HF/FLA's `l2norm`)."""
  x = x.astype(jnp.float32)
  return x * jax.lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + eps)


def recurrent_gated_delta_rule(q: Array, k: Array, v: Array, g: Array, beta: Array,
                               initial_state: Array | None = None) -> tuple[Array, Array]:
  """The gated delta rule one token at a time (see the module docstring).

  Args:
    q, k: [B, T, H, Dk] (already normalised; q already scaled). v: [B, T, H, Dv]. g, beta: [B, T, H].
    initial_state: [B, H, Dk, Dv] or None (zeros).

  Returns:
    (o [B, T, H, Dv], final state [B, H, Dk, Dv]), float32.
  """
  b, _, h, dk = k.shape
  dv = v.shape[-1]
  state = jnp.zeros((b, h, dk, dv), jnp.float32) if initial_state is None else initial_state.astype(jnp.float32)

  def step(s, inputs):
    q_t, k_t, v_t, g_t, beta_t = inputs
    s = s * jnp.exp(g_t)[..., None, None]
    predicted = jnp.einsum("bhk,bhkv->bhv", k_t, s, precision=_HIGHEST)  # what S already returns for k_t
    delta = (v_t - predicted) * beta_t[..., None]
    s = s + k_t[..., :, None] * delta[..., None, :]
    return s, jnp.einsum("bhk,bhkv->bhv", q_t, s, precision=_HIGHEST)

  time_major = [jnp.moveaxis(x.astype(jnp.float32), 1, 0) for x in (q, k, v, g, beta)]
  state, out = jax.lax.scan(step, state, time_major)
  return jnp.moveaxis(out, 0, 1), state




def chunked_gated_delta_rule(q: Array, k: Array, v: Array, g: Array, beta: Array, initial_state: Array | None = None,
                             chunk_size: int = 64, matmul_dtype: Any = jnp.float32) -> tuple[Array, Array]:
  """The gated delta rule in chunks of C = min(chunk_size, T) tokens; same arguments and results as the recurrent form.
  `matmul_dtype` (f32 or bf16): the chunk matmuls' operands (`chunk_matmul`) and the stored chunk inputs of the scan
  (the module docstring); the state and the results stay f32.

  T is padded to a multiple of C with no-op tokens (g = β = 0, q = k = v = 0). Within a chunk, with
  γ_i = Σ_{j<=i} g_j (cumulative log decay from the chunk start), Γ_ij = exp(γ_i − γ_j) for i >= j (else 0):
    L = strictly_lower(diag(β) K Kᵀ ⊙ Γ),   U = (I + L)⁻¹ diag(β) V,   W = (I + L)⁻¹ diag(β ⊙ e^γ) K
  (the WY form of the C rank-one updates: a unit lower-triangular solve, `solve_unit_lower`), then for the chunk's
  incoming state S:
    V' = U − W S,   O = (Q ⊙ e^γ) S + (Q Kᵀ ⊙ Γ) V',   S ← e^{γ_C} S + (K ⊙ e^{γ_C − γ})ᵀ V'.
  Every exponent is <= 0, so nothing overflows. All chunks' intra-chunk terms are computed at once; only the last
  three lines run inside the `lax.scan` over chunks.
  """
  b, t, h, dk = k.shape
  dv = v.shape[-1]
  c = max(1, min(chunk_size, t))
  n = -(-t // c)
  pad = n * c - t
  f32 = lambda x: x.astype(jnp.float32)
  pad_time = lambda x: jnp.pad(x, ((0, 0), (0, pad)) + ((0, 0),) * (x.ndim - 2))
  # q, k, v in the matmul dtype from here (bf16: half the bytes of every chunk array made from them); g, β in f32.
  q, k, v = (pad_time(x.astype(matmul_dtype)) for x in (q, k, v))
  g, beta = pad_time(f32(g)), pad_time(f32(beta))
  # [B, T, H, D] → [N, B, H, C, D]: chunks first, for the scan.
  to_chunks = lambda x: x.reshape(b, n, c, h, -1).transpose(1, 0, 3, 2, 4)
  q, k, v = to_chunks(q), to_chunks(k), to_chunks(v)
  g, beta = to_chunks(g[..., None])[..., 0], to_chunks(beta[..., None])[..., 0]  # [N, B, H, C]

  gamma = jnp.cumsum(g, axis=-1)
  lower = jnp.tril(jnp.ones((c, c), bool))
  gamma_diff = gamma[..., :, None] - gamma[..., None, :]
  decay = jnp.where(lower, jnp.exp(jnp.where(lower, gamma_diff, 0.0)), 0.0)  # Γ, zero above the diagonal
  mm = lambda eq, x, y: chunk_matmul(eq, x, y, matmul_dtype)
  stored = lambda x: x.astype(matmul_dtype)  # what the scan reads per chunk (and autodiff saves for its backward)
  k_beta = k * beta[..., None]
  strict = mm("...ik,...jk->...ij", k_beta, k) * decay * (1.0 - jnp.eye(c))
  # One solve for both right-hand sides: [U | W] = (I + L)⁻¹ [βV | β e^γ K].
  rhs = jnp.concatenate([v * beta[..., None], k_beta * jnp.exp(gamma)[..., None]], axis=-1)
  uw = solve_unit_lower(strict, rhs, matmul_dtype)
  u, w = stored(uw[..., :dv]), stored(uw[..., dv:])
  attn = stored(mm("...ik,...jk->...ij", q, k) * decay)
  q_decayed = stored(q * jnp.exp(gamma)[..., None])
  k_decayed = stored(k * jnp.exp(gamma[..., -1:] - gamma)[..., None])
  chunk_decay = jnp.exp(gamma[..., -1])[..., None, None]  # [N, B, H, 1, 1]

  def step(s, chunk):
    u_i, w_i, attn_i, q_i, k_i, decay_i = chunk
    v_new = u_i - mm("bhck,bhkv->bhcv", w_i, s)
    out = mm("bhck,bhkv->bhcv", q_i, s) + mm("bhcj,bhjv->bhcv", attn_i, v_new)
    s = decay_i * s + mm("bhck,bhcv->bhkv", k_i, v_new)
    return s, out

  state = jnp.zeros((b, h, dk, dv), jnp.float32) if initial_state is None else f32(initial_state)
  state, out = jax.lax.scan(step, state, (u, w, attn, q_decayed, k_decayed, chunk_decay))
  out = out.transpose(1, 0, 3, 2, 4).reshape(b, n * c, h, dv)[:, :t]
  return out, state


def causal_conv1d(x: Array, weight: Array, mask: Array, conv_state: Array | None = None) -> tuple[Array, Array]:
  """Causal depthwise conv + SiLU over the real tokens of each row, continuing from `conv_state`.

  `y_t = silu(Σ_{j<K} weight[j] · x̃_{t−K+1+j})` where x̃ is the row's real tokens in order, preceded by the K − 1
  inputs in `conv_state` (zeros at the start of a sequence). Padding tokens are skipped, not convolved as zeros:
  each row is compacted (real tokens first, stable) before the conv and scattered back after, so a padded token is
  a no-op wherever it sits (left, right or between real tokens). For left/right padding this equals HF, which zeroes
  padded inputs.

  Args:
    x: [B, T, C]; weight: [K, C] (HF `conv1d.weight [C, 1, K]` transposed); mask: [B, T] bool;
    conv_state: [B, K − 1, C], the last K − 1 real inputs (oldest first), or None.

  Returns:
    (y [B, T, C], zero at padding; new conv state [B, K − 1, C] = the last K − 1 real inputs).
  """
  b, t, ch = x.shape
  k = weight.shape[0]
  m = mask.astype(jnp.int32)
  real = jnp.sum(m, axis=1, dtype=jnp.int32)
  # Compacted slot of every token: real tokens first in order, padding after them (a permutation of [0, T)).
  slot = jnp.where(mask, jnp.cumsum(m, axis=1) - 1, real[:, None] + jnp.cumsum(1 - m, axis=1) - 1)
  compact = jax.vmap(lambda row, s: jnp.zeros_like(row).at[s].set(row))(x, slot)
  if conv_state is None:
    conv_state = jnp.zeros((b, k - 1, ch), x.dtype)
  full = jnp.concatenate([conv_state.astype(x.dtype), compact], axis=1)  # [B, K − 1 + T, C]
  y = sum(full[:, j:j + t] * weight[j].astype(x.dtype) for j in range(k))  # K shifted slices (K = 4)
  y = jnp.take_along_axis(y, slot[..., None], axis=1)  # back to the original positions
  y = jnp.where(mask[..., None], nn.silu(y), 0).astype(x.dtype)
  last = real[:, None] + jnp.arange(k - 1)[None, :]  # in `full`, the last K − 1 real inputs
  return y, jnp.take_along_axis(full, last[..., None], axis=1)


class SegmentedLinear(nn.Module):
  """`Linear` with one kernel `[Σ widths, in]` (HF's `in_proj_qkv`: [q | k | v] rows) applied as one product per
  segment of rows: x [..., in] → [y_i [..., widths_i]].

  Why apart: under tensor parallelism the kernel's rows split over `tensor` contiguously, so one [..., 8,192] product
  for Qwen3.5-35B-A3B's [q 2,048 | k 2,048 | v 4,096] puts q and k on one shard of two and v on the other, and
  slicing q, k, v out of it to split each by heads moves the activations between the shards (collective-permutes of
  [T, 2,048] bf16 rows in every layer's forward, recompute and backward). A product per segment splits each
  segment by its own heads, and XLA moves the (smaller, already gathered) kernel rows instead.
  """
  widths: tuple[int, ...]
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x: Array) -> list[Array]:
    kernel = self.param("kernel", linear_init(0, 1, "linear_mix", "embed"), (sum(self.widths), x.shape[-1]),
                        self.param_dtype).astype(self.dtype)
    x = x.astype(self.dtype)
    bounds = [sum(self.widths[:i]) for i in range(len(self.widths) + 1)]
    return [linear_matmul(x, kernel[lo:hi]) for lo, hi in zip(bounds, bounds[1:])]


class GatedRMSNorm(nn.Module):
  """`y = scale · x / sqrt(mean(x²) + eps) · silu(gate)` over the last axis (statistics in float32); scale init 1."""
  eps: float
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x: Array, gate: Array) -> Array:
    scale = self.param("scale", nn.with_logical_partitioning(nn.initializers.ones_init(), ("norm",)),
                       (x.shape[-1],), self.param_dtype)
    x32 = x.astype(jnp.float32)
    normed = (x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)).astype(self.dtype)
    return (scale.astype(self.dtype) * normed * nn.silu(gate.astype(jnp.float32))).astype(self.dtype)


def linear_attention_cache(config: ModelConfig, batch_size: int, dtype: Any) -> dict[str, Array]:
  """An empty cache entry of one linear-attention layer: {'conv': [B, K − 1, C] dtype, 'state': [B, Hv, Dk, Dv]
  float32} with C = 2·Hk·Dk + Hv·Dv."""
  channels = 2 * config.linear_num_key_heads * config.linear_key_head_dim + (
      config.linear_num_value_heads * config.linear_value_head_dim)
  return {"conv": jnp.zeros((batch_size, config.linear_conv_kernel_dim - 1, channels), dtype),
          "state": jnp.zeros((batch_size, config.linear_num_value_heads, config.linear_key_head_dim,
                              config.linear_value_head_dim), jnp.float32)}


class GatedDeltaNet(nn.Module):
  """The `linear_attn` block: projections, conv, the gated delta rule, gated RMSNorm, `out_proj`.

  With Hk q/k heads of Dk, Hv = r·Hk v heads of Dv (each q/k head serves r consecutive v heads):
    [q | k | v] = silu(causal_conv1d(x W_qkv)),  z = x W_z,  β = sigmoid(x W_b),
    g = −exp(A_log) · softplus(x W_a + dt_bias),  o = gated_delta_rule(l2n(q)/√Dk, l2n(k), v, g, β),
    out = out_proj(GatedRMSNorm(o, z)).
  Params (HF layout, kernels `[out..., in]`): qwen3_5: in_proj_qkv `[2·Hk·Dk + Hv·Dv, embed]`, in_proj_z
  `[Hv·Dv, embed]`, in_proj_b / in_proj_a `[Hv, embed]`; qwen3_next: in_proj_qkvz `[Hk, 2·Dk + 2·r·Dv, embed]` and
  in_proj_ba `[Hk, 2·r, embed]` (grouped per key head); conv1d `[K, 2·Hk·Dk + Hv·Dv]` (HF's `[C, 1, K]`
  transposed: a small tensor), A_log / dt_bias `[Hv]`, norm.scale `[Dv]`, out_proj `[embed, Hv·Dv]`.
  """
  config: ModelConfig

  @nn.compact
  def __call__(self, x: Array, token_mask: Array,
               cache: dict[str, Array] | None) -> tuple[Array, dict[str, Array] | None]:
    """x: [B, T, E]; token_mask: [B, T] (1 = real token); cache: {'conv', 'state'} or None → (out [B, T, E], cache)."""
    cfg = self.config
    dtype, param_dtype = dtypes(cfg)
    hk, hv, dk, dv = (cfg.linear_num_key_heads, cfg.linear_num_value_heads, cfg.linear_key_head_dim,
                      cfg.linear_value_head_dim)
    r = hv // hk
    b, t, _ = x.shape
    mask = token_mask.astype(bool)
    x = jnp.where(mask[..., None], x, 0).astype(dtype)  # as HF: padded inputs are zeroed before the projections

    def dense(name, features, *axes):
      return Linear(features, (*axes, "embed"), dtype=dtype, param_dtype=param_dtype, name=name)(x)

    if cfg.linear_fused_proj:
      qkvz = dense("in_proj_qkvz", (hk, 2 * dk + 2 * r * dv), "linear_heads", "linear_mix")
      ba = dense("in_proj_ba", (hk, 2 * r), "linear_heads", "linear_mix")
      q, k = qkvz[..., :dk], qkvz[..., dk:2 * dk]
      v, z = qkvz[..., 2 * dk:2 * dk + r * dv], qkvz[..., 2 * dk + r * dv:]
      mixed = [q.reshape(b, t, -1), k.reshape(b, t, -1), v.reshape(b, t, -1)]  # [q | k | v], convolved apart
      z = z.reshape(b, t, hv, dv)
      beta_logit, a = ba[..., :r].reshape(b, t, hv), ba[..., r:].reshape(b, t, hv)
    else:
      mixed = SegmentedLinear((hk * dk, hk * dk, hv * dv), dtype, param_dtype, name="in_proj_qkv")(x)
      z = dense("in_proj_z", hv * dv, "linear_mix").reshape(b, t, hv, dv)
      beta_logit = dense("in_proj_b", hv, "linear_heads")
      a = dense("in_proj_a", hv, "linear_heads")

    if cfg.sequence_parallel and cache is None:
      # Sequence parallelism (sao.models.sequence_parallel): the projections keep the chip's own tokens (their
      # weights gathered); the conv and the recurrence need whole sequences, so q, k, v and the per-head gates move
      # to channels / heads over `tensor` (all-to-alls); z stays with the tokens for the output norm.
      mixed = [sequence_parallel.split_heads(sequence_parallel.split_tokens(m)) for m in mixed]
      beta_logit, a = (sequence_parallel.split_heads(sequence_parallel.split_tokens(g)) for g in (beta_logit, a))
      z = sequence_parallel.split_tokens(z)
    widths = [m.shape[-1] for m in mixed]
    conv_w = self.param("conv1d", kernel_init(None, "linear_mix"), (cfg.linear_conv_kernel_dim, sum(widths)),
                        param_dtype)
    # The conv is depthwise: q, k and v convolve apart, each with its own columns of the weight and the state.
    bounds = [sum(widths[:i]) for i in range(4)]
    conv_states, segments = [], []
    for i, segment in enumerate(mixed):
      lo, hi = bounds[i], bounds[i + 1]
      out_i, state_i = causal_conv1d(segment, conv_w[:, lo:hi], mask,
                                     None if cache is None else cache["conv"][..., lo:hi])
      segments.append(out_i)
      conv_states.append(state_i)
    conv_state = jnp.concatenate(conv_states, axis=-1)
    q = segments[0].reshape(b, t, hk, dk)
    k = segments[1].reshape(b, t, hk, dk)
    # Normalised in f32, then kept in the chunk matmuls' dtype (bf16: half the bytes of the repeated heads).
    rule_dtype = MATMUL_DTYPES[cfg.linear_attn_matmul]
    v = segments[2].reshape(b, t, hv, dv).astype(rule_dtype)
    q = jnp.repeat((l2_normalize(q) * dk ** -0.5).astype(rule_dtype), r, axis=2)  # q/k head i: v heads i·r … i·r + r − 1
    k = jnp.repeat(l2_normalize(k).astype(rule_dtype), r, axis=2)

    a_log = self.param("A_log", nn.with_logical_partitioning(
        lambda key, shape, dt: jnp.log(jax.random.uniform(key, shape, dt, 1.0, 16.0)), ("linear_heads",)),
        (hv,), param_dtype)
    dt_bias = self.param("dt_bias", nn.with_logical_partitioning(nn.initializers.ones_init(), ("linear_heads",)),
                         (hv,), param_dtype)
    g = -jnp.exp(a_log.astype(jnp.float32)) * jax.nn.softplus(a.astype(jnp.float32) + dt_bias.astype(jnp.float32))
    beta = jax.nn.sigmoid(beta_logit.astype(jnp.float32))
    g, beta = jnp.where(mask[..., None], g, 0.0), jnp.where(mask[..., None], beta, 0.0)  # padding: exact no-op

    state = None if cache is None else cache["state"]
    if cfg.linear_attn_form == "recurrent" or (cache is not None and t == 1):
      out, state = recurrent_gated_delta_rule(q, k, v, g, beta, state)
    else:
      out, state = chunked_gated_delta_rule(q, k, v, g, beta, state, cfg.linear_chunk_size,
                                            MATMUL_DTYPES[cfg.linear_attn_matmul])
    sp = cfg.sequence_parallel and cache is None
    if sp:
      out = sequence_parallel.split_tokens(out)
    out = GatedRMSNorm(cfg.rms_norm_eps, dtype, param_dtype, name="norm")(out.astype(dtype), z)
    out = Linear(cfg.hidden_size, ("embed", "linear_mix"), dtype=dtype, param_dtype=param_dtype,
                 name="out_proj")(out.reshape(b, t, hv * dv))
    if sp:
      out = sequence_parallel.split_tokens(out)
    new_cache = None if cache is None else {"conv": conv_state.astype(cache["conv"].dtype), "state": state}
    return out, new_cache
