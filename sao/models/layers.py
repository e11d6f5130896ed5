"""Building blocks of the decoder (flax.linen): RMSNorm, RoPE, GQA attention with a KV cache, SwiGLU MLP, MoE.

The hybrid family (qwen3_next / qwen3_5) adds: zero-centred RMSNorm (weight applied as 1 + w), partial RoPE, an
output gate on full attention, and a sigmoid-gated shared expert in the MoE; its linear-attention block lives in
`sao.models.gated_deltanet`.

Linear weights are stored in HF's `nn.Linear` layout, `[out..., in...]` (`Linear`: the matmul contracts the input's
last dims with the kernel's last dims), so an HF tensor and our param are the same bytes, reshaped (`sao.models.hf`):
export and load copy bytes, no transpose. Every parameter carries logical axis names
(`nn.with_logical_partitioning`); `sao.models.sharding` maps them to mesh axes. Logical names: `embed` (hidden),
`vocab`, `heads`, `kv_heads`, `head_dim`, `mlp` (dense MLP width), `expert`, `expert_mlp` (expert MLP width),
`linear_heads` / `linear_mix` (Gated DeltaNet heads / projection widths), `norm` (norm scales, never sharded).
Statistics (norm variance, softmax, router
probabilities, logits) are computed in float32 whatever the compute dtype.
"""
from __future__ import annotations

import functools

import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from sao.models import moe, sequence_parallel
from sao.models.attention import AttentionMask, attention
from sao.models.config import ModelConfig

Array = jax.Array
_KERNEL_INIT = nn.initializers.normal(stddev=0.02)
# What a param tree's linear weights are laid out as; checkpoints record it (`sao.train.checkpoint`) and refuse a
# tree written in another layout. "in_out" (kernels `[in..., out...]`, flax's `nn.Dense`) was the layout before.
PARAM_LAYOUT = "hf_out_in"


def dtypes(config: ModelConfig) -> tuple[Any, Any]:
  """(compute dtype, param dtype) as jnp dtypes."""
  return jnp.dtype(config.dtype), jnp.dtype(config.param_dtype)


def kernel_init(*axes: str | None):
  return nn.with_logical_partitioning(_KERNEL_INIT, axes)


def linear_init(n_batch: int, n_out: int, *axes: str | None, stddev: float = 0.02):
  """Normal(0, stddev²) init of a `[batch..., out..., in...]` kernel (`n_batch` leading stacked dims, e.g. experts),
  with logical `axes` in that order.

  The values are drawn as `[batch..., Π in, Π out]` and transposed: the same numbers the earlier `[in, out]` layout
  drew from the same key (a normal draw depends on the key and the element count only), so a model initialised from
  a seed is the same function of its inputs in either layout.
  """
  base = nn.initializers.normal(stddev=stddev)

  def init(key, shape, dtype=jnp.float32):
    batch, outs, ins = shape[:n_batch], shape[n_batch:n_batch + n_out], shape[n_batch + n_out:]
    drawn = base(key, tuple(batch) + (math.prod(ins), math.prod(outs)), dtype)
    return jnp.swapaxes(drawn, -1, -2).reshape(shape)

  return nn.with_logical_partitioning(init, axes)


def zeros_init(*axes: str | None):
  return nn.with_logical_partitioning(nn.initializers.zeros_init(), axes)


def linear_matmul(x: Array, kernel: Array, n_in: int = 1) -> Array:
  """`y = x · Wᵀ` for W in HF's layout, as one 2-D product. x: [lead..., in...]; kernel: [out..., in...], its last
  `n_in` dims equal to x's; returns [lead..., out...] in the operands' dtype.

  `y[l, o] = Σ_i x[l, i] · W[o, i]` over the flattened dims (L = Π lead, I = Π in, O = Π out): the same function and
  FLOPs as one dot_general contracting x's last `n_in` dims with W's. Why flatten: in the backward pass the weight
  gradient `dW[o, i] = Σ_l dy[l, o] · x[l, i]` contracts the leading dims of both operands. Over a single token dim [L],
  XLA:CPU runs that product on its transposed operand directly; over [B, T] it first materialises the gradient
  transposed (`[O, B, T]` from `[B, T, O]`), a strided elementwise fusion that on the SwiGLU gate cost as much as the
  product itself (docs/performance_learner.md, "Where the update's time goes"). The reshapes are free (row-major
  bitcasts).
  """
  lead, ins = x.shape[:x.ndim - n_in], x.shape[x.ndim - n_in:]
  outs = kernel.shape[:kernel.ndim - n_in]
  if tuple(kernel.shape[kernel.ndim - n_in:]) != tuple(ins):
    raise ValueError(f"linear_matmul: kernel {kernel.shape} ([out..., in...]) does not end in x's last {n_in} "
                     f"dims {tuple(ins)} (x {x.shape})")
  y = jax.lax.dot_general(x.reshape(math.prod(lead), math.prod(ins)),
                          kernel.reshape(math.prod(outs), math.prod(ins)), (((1,), (1,)), ((), ())))
  return y.reshape(tuple(lead) + tuple(outs))


class Linear(nn.Module):
  """`y = x · Wᵀ + b` with W in HF's layout: kernel `[out..., in...]`, `in` = x's last `n_in` dims.

  x: [..., in...] → y: [..., out...] (`features` = the out dims). Inputs and kernel are cast to `dtype`, one 2-D
  product over the flattened dims (`linear_matmul`; the same FLOPs as flax's `[in, out]` `nn.DenseGeneral`).
  `kernel_axes` / `bias_axes`: the logical names of `[out..., in...]` /
  `[out...]`; `stddev`: of the kernel's normal init (`linear_init`).
  """
  features: int | tuple[int, ...]
  kernel_axes: tuple[str | None, ...]
  bias_axes: tuple[str | None, ...] = ()
  n_in: int = 1
  use_bias: bool = False
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32
  stddev: float = 0.02

  @nn.compact
  def __call__(self, x: Array) -> Array:
    outs = (self.features,) if isinstance(self.features, int) else tuple(self.features)
    ins = x.shape[x.ndim - self.n_in:]
    if len(self.kernel_axes) != len(outs) + self.n_in:
      raise ValueError(f"{self.name}: kernel_axes {self.kernel_axes} do not name the {len(outs) + self.n_in} dims of "
                       f"a [out..., in...] kernel {outs + tuple(ins)}")
    kernel = self.param("kernel", linear_init(0, len(outs), *self.kernel_axes, stddev=self.stddev), outs + tuple(ins),
                        self.param_dtype)
    y = linear_matmul(x.astype(self.dtype), kernel.astype(self.dtype), self.n_in)
    if self.use_bias:
      bias = self.param("bias", zeros_init(*self.bias_axes), outs, self.param_dtype)
      y = y + bias.astype(self.dtype)
    return y


class RMSNorm(nn.Module):
  """`y = scale * x / sqrt(mean(x², -1) + eps)`, statistics in float32; params: scale `[D]` (init 1).

  `zero_centered` (qwen3_next / qwen3_5): `y = (1 + scale) * x / sqrt(...)`, scale init 0, multiplied in float32.
  """
  eps: float
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32
  zero_centered: bool = False

  @nn.compact
  def __call__(self, x: Array) -> Array:
    init = nn.initializers.zeros_init() if self.zero_centered else nn.initializers.ones_init()
    scale = self.param("scale", nn.with_logical_partitioning(init, ("norm",)), (x.shape[-1],), self.param_dtype)
    x32 = x.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + self.eps)
    if self.zero_centered:  # HF Qwen3NextRMSNorm: (x̂ · (1 + w)) in float32, then cast
      return (normed * (1.0 + scale.astype(jnp.float32))).astype(self.dtype)
    # HF casts the normalised activations back to the input dtype before the scale multiply.
    return (scale.astype(self.dtype) * normed.astype(self.dtype)).astype(self.dtype)


def norm(config: ModelConfig, name: str) -> RMSNorm:
  """The config's RMSNorm (zero-centred for the hybrid family)."""
  dtype, param_dtype = dtypes(config)
  return RMSNorm(config.rms_norm_eps, dtype, param_dtype, zero_centered=config.zero_centered_norm, name=name)


def apply_rope(x: Array, positions: Array, theta: float, rotary_dim: int | None = None) -> Array:
  """Rotary embedding, HF "rotate_half" layout (first half / second half of the rotated dims paired).

  x: [B, T, H, D]; positions: [B, T] int. Only the first R = rotary_dim (default D) dims rotate, the rest pass
  through (partial RoPE). With inv_freq_i = θ^(-2i/R) and a = pos · inv_freq (duplicated to R):
  `y = x · cos(a) + rotate_half(x) · sin(a)`, rotate_half(x) = concat(-x[R/2:], x[:R/2]). Computed in float32.
  """
  if rotary_dim is not None and rotary_dim < x.shape[-1]:
    rotated = apply_rope(x[..., :rotary_dim], positions, theta)
    return jnp.concatenate([rotated, x[..., rotary_dim:]], axis=-1)
  d = x.shape[-1]
  inv_freq = 1.0 / (theta ** (jnp.arange(0, d, 2, dtype=jnp.float32) / d))  # [D/2]
  angles = positions.astype(jnp.float32)[..., None] * inv_freq  # [B, T, D/2]
  angles = jnp.concatenate([angles, angles], axis=-1)[:, :, None, :]  # [B, T, 1, D]
  x32 = x.astype(jnp.float32)
  rotated = jnp.concatenate([-x32[..., d // 2:], x32[..., : d // 2]], axis=-1)
  return (x32 * jnp.cos(angles) + rotated * jnp.sin(angles)).astype(x.dtype)


def _write_rows(buffer: Array, update: Array, index: Array) -> Array:
  """buffer[b, index[b] : index[b] + T] = update[b] for every row b. buffer: [B, S, ...]; update: [B, T, ...].

  (`dynamic_update_slice` clamps out-of-range starts; callers size the cache so index + T <= S.)
  """
  def write_row(buf, upd, i):
    return jax.lax.dynamic_update_slice(buf, upd.astype(buf.dtype), (i,) + (0,) * (buf.ndim - 1))
  return jax.vmap(write_row)(buffer, update, index)


class Attention(nn.Module):
  """Full causal GQA self-attention (`self_attn`): q/k/v/o projections, optional biases, optional q/k RMSNorm, RoPE.

  Kernels (HF layout, `Linear`): q_proj `[heads, head_dim, embed]`, k_proj / v_proj `[kv_heads, head_dim, embed]`,
  o_proj `[embed, heads, head_dim]`. With `attn_output_gate` (qwen3_next / qwen3_5) q_proj is
  `[heads, 2·head_dim, embed]` = [q | gate] per head (HF's layout) and `out = o_proj(attn · sigmoid(gate))`.
  """
  config: ModelConfig

  @nn.compact
  def __call__(self, x: Array, positions: Array, mask: AttentionMask, write_index: Array | None,
               cache: dict[str, Array] | None) -> tuple[Array, dict[str, Array] | None]:
    """x: [B, T, E]; positions: [B, T]; mask: which keys each query sees (`sao.models.attention.AttentionMask`,
    key_valid [B, S]); cache: {'k','v': [B, S, K, D]} or None (then S = T).

    With a cache, this chunk's k/v are written at slots write_index[b] + [0, T) before attending.
    Returns (out [B, T, E], updated cache or None).
    """
    cfg = self.config
    dtype, param_dtype = dtypes(cfg)

    def proj(name, heads, axis_name, bias, width=1):
      return Linear((heads, width * cfg.head_dim), (axis_name, "head_dim", "embed"), (axis_name, "head_dim"),
                    use_bias=bias, dtype=dtype, param_dtype=param_dtype, name=name)(x)

    # Sequence parallelism (sao.models.sequence_parallel): the projections keep the chip's own tokens (their
    # weights gathered), attention reaches its heads by an all-to-all, and its output comes back to the tokens.
    by_tokens = sequence_parallel.split_tokens if cfg.sequence_parallel and cache is None else lambda a: a
    q = by_tokens(proj("q_proj", cfg.num_heads, "heads", cfg.attention_bias, 2 if cfg.attn_output_gate else 1))
    gate = None
    if cfg.attn_output_gate:
      q, gate = q[..., :cfg.head_dim], q[..., cfg.head_dim:]
    k = by_tokens(proj("k_proj", cfg.num_kv_heads, "kv_heads", cfg.attention_bias))
    v = by_tokens(proj("v_proj", cfg.num_kv_heads, "kv_heads", cfg.attention_bias))
    if cfg.qk_norm:
      q = norm(cfg, "q_norm")(q)
      k = norm(cfg, "k_norm")(k)
    q = apply_rope(q, positions, cfg.rope_theta, cfg.rotary_dim)
    k = apply_rope(k, positions, cfg.rope_theta, cfg.rotary_dim)
    new_cache = None
    if cache is not None:
      k = _write_rows(cache["k"], k, write_index)
      v = _write_rows(cache["v"], v, write_index)
      new_cache = {"k": k, "v": v}
      k, v = k.astype(dtype), v.astype(dtype)
    out = by_tokens(attention(q, k, v, mask, cfg.attention_impl))
    if gate is not None:
      out = (out * jax.nn.sigmoid(gate.astype(jnp.float32))).astype(dtype)
    out = Linear(cfg.hidden_size, ("embed", "heads", "head_dim"), ("embed",), n_in=2, use_bias=cfg.attention_out_bias,
                 dtype=dtype, param_dtype=param_dtype, name="o_proj")(out)
    return by_tokens(out), new_cache


class MLP(nn.Module):
  """SwiGLU: `down(silu(gate(x)) * up(x))`; kernels (HF layout) gate/up `[mlp, embed]`, down `[embed, mlp]`.

  Width `intermediate_size` (default: the config's; the shared expert passes its own)."""
  config: ModelConfig
  intermediate_size: int | None = None

  @nn.compact
  def __call__(self, x: Array) -> Array:
    cfg = self.config
    dtype, param_dtype = dtypes(cfg)
    width = self.intermediate_size or cfg.intermediate_size

    def dense(name, features, in_axis, out_axis, inp):
      return Linear(features, (out_axis, in_axis), (out_axis,), use_bias=cfg.mlp_bias, dtype=dtype,
                    param_dtype=param_dtype, name=name)(inp)

    h = nn.silu(dense("gate_proj", width, "embed", "mlp", x))
    h = h * dense("up_proj", width, "embed", "mlp", x)
    return dense("down_proj", cfg.hidden_size, "mlp", "embed", h)


class MoE(nn.Module):
  """Sparse MoE block (qwen3_moe); the expert computation is `sao.models.moe` (`config.moe_impl`).

  Router: `p = softmax(x @ gate)` (float32) over X experts, top-k, renormalised over the k when norm_topk_prob.
  `y = Σ_{e ∈ topk} p_e · down_e(silu(gate_e(x)) * up_e(x))`. "routed" (default): assignments sorted by expert and
  grouped matmuls, FLOPs ∝ k; "dense": every expert on every token, unselected ones weighted 0 (the test oracle).
  Params (HF layout): gate.kernel `[X, embed]`; experts.gate_proj / up_proj `[X, expert_mlp, embed]`, down_proj
  `[X, embed, expert_mlp]` (HF's per-expert `(out, in)` weights stacked, as transformers ≥ 5 fuses them).
  Shared expert (qwen3_next / qwen3_5_moe, `shared_expert_intermediate_size > 0`): every token also gets
  `sigmoid(x @ shared_expert_gate) · shared_expert(x)` (a SwiGLU MLP; shared_expert_gate.kernel `[1, embed]`).
  """
  config: ModelConfig

  @nn.compact
  def __call__(self, x: Array, replayed: Array | None = None) -> Array:
    """x [B, T, E] → [B, T, E]. `replayed` [B, T, k] int32: expert ids to use instead of this router's top-k
    (routing replay, `moe.replay_route`; a row with a negative id keeps its own top-k). The experts used are sown
    into the `routing` collection as `routed_experts` [B, T, k] int32 (kept only when the caller makes it mutable: the
    engine's capture for SGLang's `routed_experts`)."""
    cfg = self.config
    dtype, param_dtype = dtypes(cfg)
    # The router runs in float32 whatever the compute dtype (bf16 logits would flip near-tied top-k choices).
    router_logits = Linear(cfg.num_experts, (None, "embed"), dtype=jnp.float32, param_dtype=param_dtype,
                           name="gate")(x)
    logits = router_logits.reshape(-1, cfg.num_experts)
    if replayed is None:
      weights, experts = moe.route(logits, cfg.num_experts_per_tok, cfg.norm_topk_prob)  # [B·T, k]
    else:
      weights, experts = moe.replay_route(logits, replayed.reshape(-1, replayed.shape[-1]), cfg.num_experts_per_tok,
                                          cfg.norm_topk_prob)
    self.sow("routing", "routed_experts", experts.reshape(*x.shape[:-1], -1))
    w_gate, w_up, w_down = ExpertWeights(cfg, name="experts")()
    tokens = x.reshape(-1, x.shape[-1]).astype(dtype)
    shared = None
    if cfg.shared_expert_intermediate_size and not cfg.mlp_bias:
      # The routed path adds it with its own layout of the tokens (under tensor parallelism, split over `tensor`
      # with the weights whole: split by width, its input all-gathered and its output reduce-scattered over the 16
      # chips of the `full` configs' `tensor` axis in every layer, 9.3 s of their 131k actor step).
      shared = moe.SharedExpert(*SharedExpertWeights(cfg, name="shared_expert")(),
                                Kernel((1, cfg.hidden_size), (None, "embed"), param_dtype, name="shared_expert_gate")())
    if cfg.moe_impl == "routed":
      out = moe.routed_experts(tokens, weights, experts, w_gate, w_up, w_down, cfg.moe_capacity_factor, shared,
                               cfg.sequence_parallel)
    else:
      out = moe.dense_experts(tokens, weights, experts, w_gate, w_up, w_down)
      out = out if shared is None else out + moe.shared_expert(tokens, shared)
    out = out.reshape(x.shape).astype(dtype)
    if cfg.shared_expert_intermediate_size and cfg.mlp_bias:  # biased projections: the plain MLP beside the experts
      shared_out = MLP(cfg, cfg.shared_expert_intermediate_size, name="shared_expert")(x)
      shared_gate = Linear(1, (None, "embed"), dtype=dtype, param_dtype=param_dtype, name="shared_expert_gate")(x)
      out = out + jax.nn.sigmoid(shared_gate.astype(jnp.float32)).astype(dtype) * shared_out
    return out


class Kernel(nn.Module):
  """A bias-free `Linear`'s kernel alone (the same param, `kernel` of `shape` `[out, in]` with logical `axes`, the same
  init), for a caller that applies it elsewhere (`moe.routed_experts` applies the shared expert)."""
  shape: tuple[int, ...]
  axes: tuple[str | None, ...]
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self) -> Array:
    return self.param("kernel", linear_init(0, 1, *self.axes), self.shape, self.param_dtype)


class SharedExpertWeights(nn.Module):
  """The shared expert's kernels (`shared_expert.{gate_proj, up_proj, down_proj}.kernel`, the params of a bias-free
  `MLP` of its width): gate / up `[S, embed]`, down `[embed, S]`."""
  config: ModelConfig

  @nn.compact
  def __call__(self) -> tuple[Array, Array, Array]:
    cfg = self.config
    _, param_dtype = dtypes(cfg)
    width, hidden = cfg.shared_expert_intermediate_size, cfg.hidden_size
    return (Kernel((width, hidden), ("mlp", "embed"), param_dtype, name="gate_proj")(),
            Kernel((width, hidden), ("mlp", "embed"), param_dtype, name="up_proj")(),
            Kernel((hidden, width), ("embed", "mlp"), param_dtype, name="down_proj")())


class ExpertWeights(nn.Module):
  """Holds the stacked expert weights (`mlp.experts.{gate_proj, up_proj, down_proj}`), `[X, out, in]` each."""
  config: ModelConfig

  @nn.compact
  def __call__(self) -> tuple[Array, Array, Array]:
    cfg = self.config
    _, param_dtype = dtypes(cfg)
    shape_in = (cfg.num_experts, cfg.moe_intermediate_size, cfg.hidden_size)  # [X, out, in]
    shape_out = (cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size)
    gate = self.param("gate_proj", linear_init(1, 1, "expert", "expert_mlp", "embed"), shape_in, param_dtype)
    up = self.param("up_proj", linear_init(1, 1, "expert", "expert_mlp", "embed"), shape_in, param_dtype)
    down = self.param("down_proj", linear_init(1, 1, "expert", "embed", "expert_mlp"), shape_out, param_dtype)
    return gate, up, down
