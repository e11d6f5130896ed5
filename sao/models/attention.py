"""Causal grouped-query attention behind one interface, in three implementations.

`attention(q, k, v, mask, impl)`: q [B, T, H, D]; k, v [B, S, K, D] with H = K·G (query head h reads kv head h // G);
`mask` an `AttentionMask` (key validity [B, S] and, with a KV cache, each query's slot [B, T]):

    visible[b, t, s] = s <= slot[b, t] ∧ key_valid[b, s]          (slot[b, t] = t without a cache, then S = T)
    out[b, t, h]     = Σ_s softmax_s(q·k / sqrt(D) | visible)[s] · v[b, s, h // G]

Scores and softmax statistics are float32 whatever the compute dtype; the output has v's dtype. A query with no
visible key (a padding query) has an unspecified output (the implementations differ there); callers never use it.

- "xla": full scores (`dense_attention`): the G query heads of each KV head folded into the rows, one
  [G·T, D] @ [D, S] product per (batch, KV head). Fastest for short sequences. `reference_attention` computes the
  same thing head by head, [B, K, G, T, S]: the test oracle of every implementation.
- "blockwise": flash-attention-style online softmax in jnp (`blockwise_attention`): query blocks × key blocks, a
  running max / denominator / accumulator in float32, key blocks with nothing visible skipped (`lax.cond`), a
  custom VJP whose backward pass recomputes probabilities per block pair from the saved log-sum-exp. No array larger
  than one [block_q, block_k] score tile per (batch, head) exists, forward or backward. K/V are not repeated per
  query head, except under a mesh whose `tensor` axis does not divide the KV heads (`replicate_kv_heads`): there
  each KV head is repeated to the query heads of its chips before the block loop, so that its gradient is summed
  over those chips once per layer (the transpose of the repeat), not once per block pair inside the loop.
- "splash": Pallas splash attention on TPU (`sao.models.splash_attention`; causal mask + segment ids for padding,
  GQA by running the MQA kernel per kv head). Only the training layout (no cache, T = S). Under a multi-device
  context mesh it runs in a `jax.shard_map` (`sharded_splash_attention`): rows over the batch axes, heads over
  `tensor`, each device's kernel on its own block; KV heads repeated first where `tensor` does not divide them.
  A padding query (key_valid false at its own slot) sees only padding keys there, so its output differs from the
  other implementations'; callers never use it.
- "cudnn": cuDNN's fused flash attention on NVIDIA GPUs (`sao.models.cudnn_attention`: causal mask only, exact
  for any key-validity mask: rows that are not right-padded are reordered valid-first around the kernel). Only the
  training layout.
- "auto" chooses by the platform the program is lowered for (`lax.platform_dependent`, `platform_impls`), not by
  `jax.default_backend()`: an ahead-of-time compile for TPU or GPU from a CPU host gets that platform's kernel. Per
  platform (`resolve_impl`): TPU splash for the training layout (T a multiple of 128, at most `SPLASH_MAX_LENGTH`)
  whenever the program's layout is known (a context mesh, whatever its size — one device runs the kernel as is,
  several run it under `shard_map` —, else a one-chip TPU host; never when a non-TPU host traces without a mesh,
  nor under a mesh of several non-TPU devices, where no TPU branch could be lowered); GPU (cuda) cudnn where
  `cudnn_unusable_reason` finds nothing against it (bf16/fp16, head dim, training layout, cuDNN here); everywhere
  else, and as those two's fallback, blockwise when one score matrix has at least `BLOCKWISE_MIN_SCORES` entries
  (T·S), else xla. Short sequences (the toy runs, decode steps) keep the reference. Where every platform gets the
  same implementation no platform switch is staged (a CPU host's programs are what they were). So the learner's
  programs lowered for a TPU pod (`experiments/compile_tpu.py`) run splash, not the jnp block loop. cuDNN's wrapper
  is custom-partitioned (batch, heads).
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from jax.sharding import PartitionSpec as P

from sao.models import cudnn_attention
from sao.models.splash_attention import (sharded_splash_attention, splash_attention,  # noqa: F401  (re-exported)
                                         splash_kernel)
from sao.models.config import ATTENTION_IMPLS as IMPLS
from sao.models.mesh_axes import TENSOR_AXIS, kv_repeats  # noqa: F401  (kv_repeats re-exported)

Array = jax.Array
# Finite "minus infinity": masked scores never produce NaN (exp(−1e30 − m) = 0 for any finite running max m).
MASK_VALUE = -1e30
BLOCK_Q = 512
BLOCK_K = 512
# "auto" switches from the reference to blockwise at T·S >= 2048² score entries per (batch, head): below that the
# [T, S] scores are small and one fused matmul beats the block loop (docs/models.md "Attention kernels").
BLOCKWISE_MIN_SCORES = 2048 * 2048
# "auto" uses splash up to this length: the kernel's causal mask is preprocessed at trace time by a Python loop over
# its (T / 512)² blocks (4,096 blocks at 32,768 tokens: 6 s on this project's CPU host), hopeless at millions.
SPLASH_MAX_LENGTH = 131072


class AttentionMask(NamedTuple):
  """Which keys each query sees, without a [B, T, S] array.

  key_valid: [B, S] bool, slot s holds a real token. query_slot: [B, T] int32, the key slot of each query (key s is
  visible iff s <= query_slot[b, t]); None means query t sits at slot t (no KV cache, S = T).
  """
  key_valid: Array
  query_slot: Array | None = None

  def slots(self, t: int) -> Array:
    """query_slot as a [B, T] int32 array (arange(T) broadcast when None)."""
    if self.query_slot is not None:
      return self.query_slot.astype(jnp.int32)
    return jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (self.key_valid.shape[0], t))

  def dense(self, t: int) -> Array:
    """The [B, T, S] bool mask (reference path only)."""
    s = self.key_valid.shape[1]
    return (jnp.arange(s)[None, None, :] <= self.slots(t)[:, :, None]) & self.key_valid.astype(bool)[:, None, :]


# The platforms "auto" stages a branch for (`lax.platform_dependent` names; "gpu" is not one).
PLATFORMS = ("cpu", "tpu", "cuda", "rocm")


def resolve_impl(impl: str, t: int, s: int, cached: bool, backend: str | None = None,
                 num_devices: int | None = None, cudnn_reason: str | None = "not asked") -> str:
  """The implementation `impl` names; "auto" picks by platform (`backend`, default `jax.default_backend()`),
  device count and size (module docstring). `cudnn_reason`: `cudnn_unusable_reason`'s answer for a cuda backend
  (None: cuDNN can run); the default keeps the jnp rule."""
  if impl not in IMPLS:
    raise ValueError(f"attention_impl: unsupported {impl!r}; expected one of {IMPLS}")
  if impl != "auto":
    return impl
  backend = backend or jax.default_backend()
  num_devices = _device_count() if num_devices is None else num_devices
  if backend == "tpu" and num_devices >= 1 and not cached and t == s and t % 128 == 0 and t <= SPLASH_MAX_LENGTH:
    return "splash"
  if backend in ("cuda", "gpu") and cudnn_reason is None:
    return "cudnn"
  return "blockwise" if t * s >= BLOCKWISE_MIN_SCORES else "xla"


def _device_count() -> int:
  """The devices of the program's mesh, as far as splash on TPU is concerned: the context mesh's size (`jax.set_mesh`,
  as the learner traces, also ahead of time for a TPU topology), else 1 on a one-chip TPU host; 0 (never splash)
  where the program's layout is unknown (no mesh: a non-TPU host, or a multi-chip TPU host whose jit would leave the
  kernel unpartitioned) or a mesh of several non-TPU devices (CPU tests and runs: a TPU branch could never be lowered
  with those devices, so it is not traced)."""
  mesh = jax.sharding.get_abstract_mesh()
  if not mesh.empty:
    device = mesh.abstract_device
    if mesh.size > 1 and device is not None and device.platform != "tpu":
      return 0
    return int(mesh.size)
  return 1 if jax.default_backend() == "tpu" and jax.device_count() == 1 else 0


def platform_impls(impl: str, q, k, cached: bool) -> dict[str, str]:
  """{lowering platform: implementation} for these (abstract) operands; `impl` other than "auto" everywhere."""
  reason = cudnn_attention.cudnn_unusable_reason(q, k, cached) if impl == "auto" else None
  return {p: resolve_impl(impl, q.shape[1], k.shape[1], cached, backend=p, cudnn_reason=reason) for p in PLATFORMS}


def attention(q: Array, k: Array, v: Array, mask: AttentionMask, impl: str = "auto", *,
              block_q: int = BLOCK_Q, block_k: int = BLOCK_K) -> Array:
  """Causal GQA attention (module docstring). q: [B, T, H, D]; k, v: [B, S, K, D]. Returns [B, T, H, D]."""
  _check_shapes(q, k, v, mask)
  cached = mask.query_slot is not None
  chosen = platform_impls(impl, q, k, cached)
  fallback = resolve_impl("auto", q.shape[1], k.shape[1], cached, backend="cpu")  # jnp, any platform

  def run(name):
    def kernel(q, k, v):
      if name == "xla":
        return dense_attention(q, k, v, mask.dense(q.shape[1]))
      if name == "blockwise":
        return blockwise_attention(q, k, v, mask, block_q=block_q, block_k=block_k)
      if cached or q.shape[1] != k.shape[1]:
        raise ValueError(f"attention_impl={name!r} supports only the training layout (no KV cache, T = S); "
                         "use 'auto' to fall back for cached decoding")
      if name == "cudnn":
        return cudnn_attention.cudnn_attention(q, k, v, mask.key_valid)
      return sharded_splash_attention(q, k, v, mask.key_valid)
    return kernel

  kernels = {name: run(name) for name in sorted(set(chosen.values()))}
  if len(kernels) == 1:
    return next(iter(kernels.values()))(q, k, v)
  # One callable per distinct implementation: platform_dependent joins the platforms sharing it into one branch.
  return jax.lax.platform_dependent(q, k, v, default=kernels[fallback],
                                    **{p: kernels[name] for p, name in chosen.items() if name != fallback})


def _check_shapes(q, k, v, mask):
  b, t, h, d = q.shape
  if k.shape != v.shape or k.ndim != 4 or k.shape[0] != b or k.shape[3] != d or h % k.shape[2]:
    raise ValueError(f"attention: q {q.shape} / k {k.shape} / v {v.shape} are not [B, T, H, D] / [B, S, K, D] "
                     f"with K dividing H")
  if mask.key_valid.shape != k.shape[:2]:
    raise ValueError(f"attention: key_valid {mask.key_valid.shape} must be [B, S] = {k.shape[:2]}")
  if mask.query_slot is None and t != k.shape[1]:
    raise ValueError(f"attention: without query_slot T ({t}) must equal S ({k.shape[1]})")
  if mask.query_slot is not None and mask.query_slot.shape != (b, t):
    raise ValueError(f"attention: query_slot {mask.query_slot.shape} must be [B, T] = {(b, t)}")


def reference_attention(q: Array, k: Array, v: Array, mask: Array) -> Array:
  """Full-scores GQA attention (the test oracle). mask: [B, T, S] bool (True = may attend).

  A row with no visible key gets a uniform softmax over all S keys (MASK_VALUE is finite), never NaN.
  """
  b, t, h, d = q.shape
  kv_heads = k.shape[2]
  q = q.reshape(b, t, kv_heads, h // kv_heads, d)
  scores = jnp.einsum("btkgd,bskd->bkgts", q, k, preferred_element_type=jnp.float32) * (d ** -0.5)
  scores = jnp.where(mask[:, None, None, :, :], scores, MASK_VALUE)
  probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
  out = jnp.einsum("bkgts,bskd->btkgd", probs, v)
  return out.reshape(b, t, h, d)


def dense_attention(q: Array, k: Array, v: Array, mask: Array) -> Array:
  """`reference_attention` in a layout XLA runs faster: heads-major, each KV head's G query heads stacked as rows.

  q [B, T, H, D] → [B, K, G·T, D]; k, v [B, S, K, D] → [B, K, S, D]; scores [B, K, G·T, S] = one batched product per (b,
  kv head) with G·T rows, instead of [B, K, G, T, S] with the head axes between the matmul's batch and row dims: the toy
  learner's update (D = 16, G = 2, T ≤ 128) spends 7–14 % less CPU (docs/performance_learner.md, "The main job's
  update"). mask: [B, T, S] bool. Same values (to rounding) and the same masked-row convention as the reference.
  """
  b, t, h, d = q.shape
  kv_heads, g = k.shape[2], h // k.shape[2]
  rows = q.reshape(b, t, kv_heads, g, d).transpose(0, 2, 3, 1, 4).reshape(b, kv_heads, g * t, d)
  keys, values = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)
  scores = jnp.einsum("bkrd,bksd->bkrs", rows, keys, preferred_element_type=jnp.float32) * (d ** -0.5)
  scores = jnp.where(mask[:, None, None], scores.reshape(b, kv_heads, g, t, -1), MASK_VALUE)
  probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype).reshape(b, kv_heads, g * t, -1)
  out = jnp.einsum("bkrs,bksd->bkrd", probs, values)
  return out.reshape(b, kv_heads, g, t, d).transpose(0, 3, 1, 2, 4).reshape(b, t, h, d)


# ------------------------------------------------------------------------------------------------------ blockwise
def blockwise_attention(q: Array, k: Array, v: Array, mask: AttentionMask, *, block_q: int = BLOCK_Q,
                        block_k: int = BLOCK_K) -> Array:
  """Online-softmax attention over [block_q, block_k] tiles (module docstring); same contract as `attention`.

  T and S need not divide the block sizes: both are padded (padded keys invalid, padded queries dropped). A query
  with no visible key outputs 0.
  """
  if block_q <= 0 or block_k <= 0:
    raise ValueError(f"attention: block sizes must be positive, got block_q={block_q}, block_k={block_k}")
  k, v = replicate_kv_heads(k, v, q.shape[2])
  b, t, h, d = q.shape
  s, kv_heads = k.shape[1], k.shape[2]
  bq, bk = min(block_q, t), min(block_k, s)
  tp, sp = -(-t // bq) * bq, -(-s // bk) * bk
  slots = jnp.pad(mask.slots(t), ((0, 0), (0, tp - t)), constant_values=-1)  # padded queries see nothing
  valid = jnp.pad(mask.key_valid.astype(bool), ((0, 0), (0, sp - s)))
  # Blocked layouts, block index leading (the scan axis): q [nq, B, K, G, bq, D]; k, v [nk, B, K, bk, D].
  qb = jnp.pad(q, ((0, 0), (0, tp - t), (0, 0), (0, 0))).reshape(b, tp // bq, bq, kv_heads, h // kv_heads, d)
  qb = qb.transpose(1, 0, 3, 4, 2, 5)
  kb, vb = (jnp.pad(x, ((0, 0), (0, sp - s), (0, 0), (0, 0))).reshape(b, sp // bk, bk, kv_heads, d)
            .transpose(1, 0, 3, 2, 4) for x in (k, v))
  slots_b = slots.reshape(b, tp // bq, bq).transpose(1, 0, 2)  # [nq, B, bq]
  valid_b = valid.reshape(b, sp // bk, bk).transpose(1, 0, 2)  # [nk, B, bk]
  out = _flash(qb, kb, vb, slots_b, valid_b)  # [nq, B, K, G, bq, D]
  out = out.transpose(1, 0, 4, 2, 3, 5).reshape(b, tp, h, d)
  return out[:, :t]


def replicate_kv_heads(k: Array, v: Array, heads: int) -> tuple[Array, Array]:
  """k, v [B, S, K, D] → [B, S, K·r, D] (each head repeated r = `kv_repeats` times, adjacent), the head dim
  constrained over the context mesh's `tensor` axis; the identity (r = 1) without such a mesh.

  Exact: query head h of G = H / K reads KV head h // G; with K·r heads and G / r queries per head it reads copy
  ⌊h·r / G⌋, which is a copy of ⌊h / G⌋. Why: with fewer KV heads than `tensor` chips the partitioner keeps each KV
  head on all the chips of its query heads and sums its gradient over them inside attention's block loop (one
  all-reduce per key block × query block). Made explicit here, the sum is the transpose of the repeat, once per
  call. Per chip the repeated K/V are [B, S, K·r / tensor, D], no more than the unsplit [B, S, K, D] when
  H >= tensor.
  """
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or TENSOR_AXIS not in mesh.shape or TENSOR_AXIS not in mesh.auto_axes:
    return k, v
  repeats = kv_repeats(heads, k.shape[2], int(mesh.shape[TENSOR_AXIS]))
  if repeats == 1:
    return k, v
  spec = P(P.UNCONSTRAINED, P.UNCONSTRAINED, TENSOR_AXIS, P.UNCONSTRAINED)
  return tuple(jax.lax.with_sharding_constraint(jnp.repeat(x, repeats, axis=2), spec) for x in (k, v))


def _tile_mask(slots: Array, valid: Array, k_start: Array) -> Array:
  """[B, 1, 1, bq, bk] visibility of one tile; slots [B, bq], valid [B, bk], k_start the tile's first key slot."""
  key_slot = k_start + jnp.arange(valid.shape[1])
  visible = (key_slot[None, None, :] <= slots[:, :, None]) & valid[:, None, :]
  return visible[:, None, None]


def _tile_live(slots: Array, valid: Array, k_start: Array) -> Array:
  """Whether any query of the block sees any key of the tile (else the tile is skipped)."""
  return jnp.any(valid) & (k_start <= jnp.max(slots))


def _scores(q, k, d):
  return jnp.einsum("bkgqd,bkcd->bkgqc", q, k, preferred_element_type=jnp.float32) * (d ** -0.5)


def _forward(qb, kb, vb, slots_b, valid_b):
  """Returns (out [nq, B, K, G, bq, D] in v's dtype, lse [nq, B, K, G, bq] float32; 0 where nothing is visible)."""
  d, bk = qb.shape[-1], kb.shape[3]
  # The tile masks depend only on the mask, which is loop-invariant when this runs inside a scan over layers
  # (`model.scan_layers`): differentiating that scan, JAX hoists loop-invariant work out of it and would materialise
  # every tile's mask and bias at once, [nq, nk, B, K, G, bq, bk] — T² memory (64 GiB per chip at 131k tokens). Tying
  # the mask to the queries behind a barrier keeps it per tile.
  qb, slots_b, valid_b = jax.lax.optimization_barrier((qb, slots_b, valid_b))

  def q_block(_, xs):
    q, slots = xs
    stats_shape = q.shape[:-1]

    def k_block(carry, ys):
      j, k, v, valid = ys
      k_start = j * bk

      def update(carry):
        m, l, acc = carry
        vis = _tile_mask(slots, valid, k_start)
        sc = _scores(q, k, d)
        m_new = jnp.maximum(m, jnp.max(jnp.where(vis, sc, MASK_VALUE), axis=-1))
        p = jnp.where(vis, jnp.exp(sc - m_new[..., None]), 0.0)
        corr = jnp.exp(m - m_new)
        pv = jnp.einsum("bkgqc,bkcd->bkgqd", p.astype(v.dtype), v, preferred_element_type=jnp.float32)
        return m_new, l * corr + jnp.sum(p, axis=-1), acc * corr[..., None] + pv

      return jax.lax.cond(_tile_live(slots, valid, k_start), update, lambda c: c, carry), None

    init = (jnp.full(stats_shape, MASK_VALUE, jnp.float32), jnp.zeros(stats_shape, jnp.float32),
            jnp.zeros(q.shape, jnp.float32))
    (m, l, acc), _ = jax.lax.scan(k_block, init, (jnp.arange(kb.shape[0]), kb, vb, valid_b))
    seen = l > 0
    out = jnp.where(seen[..., None], acc / jnp.where(seen, l, 1.0)[..., None], 0.0)
    lse = jnp.where(seen, m + jnp.log(jnp.where(seen, l, 1.0)), 0.0)
    return None, (out.astype(vb.dtype), lse)

  _, (out, lse) = jax.lax.scan(q_block, None, (qb, slots_b))
  return out, lse


@jax.custom_vjp
def _flash(qb, kb, vb, slots_b, valid_b):
  return _forward(qb, kb, vb, slots_b, valid_b)[0]


def _flash_fwd(qb, kb, vb, slots_b, valid_b):
  out, lse = _forward(qb, kb, vb, slots_b, valid_b)
  return out, (qb, kb, vb, slots_b, valid_b, out, lse)


def _flash_bwd(res, dout):
  """Flash-attention backward: with P = exp(S − lse) per tile and Δ = rowsum(dO ∘ O),
  dV = Pᵀ dO, dS = P ∘ (dO Vᵀ − Δ), dQ = dS K / sqrt(D), dK = dSᵀ Q / sqrt(D). Two passes (dQ over key tiles per
  query block; dK, dV over query tiles per key block), so only per-block accumulators are carried."""
  qb, kb, vb, slots_b, valid_b, out, lse = res
  d, bk = qb.shape[-1], kb.shape[3]
  scale = d ** -0.5
  dout32 = dout.astype(jnp.float32)
  delta = jnp.sum(dout32 * out.astype(jnp.float32), axis=-1)  # [nq, B, K, G, bq]

  def tile(q, k, v, slots, valid, k_start, lse, do, delta):
    vis = _tile_mask(slots, valid, k_start)
    p = jnp.where(vis, jnp.exp(_scores(q, k, d) - lse[..., None]), 0.0)
    dp = jnp.einsum("bkgqd,bkcd->bkgqc", do, v, preferred_element_type=jnp.float32)
    return p, p * (dp - delta[..., None])

  def dq_block(_, xs):
    q, slots, lse, do, delta = xs

    def k_block(dq, ys):
      j, k, v, valid = ys

      def update(dq):
        _, ds = tile(q, k, v, slots, valid, j * bk, lse, do, delta)
        return dq + jnp.einsum("bkgqc,bkcd->bkgqd", ds, k, preferred_element_type=jnp.float32) * scale

      return jax.lax.cond(_tile_live(slots, valid, j * bk), update, lambda c: c, dq), None

    dq, _ = jax.lax.scan(k_block, jnp.zeros(q.shape, jnp.float32), (jnp.arange(kb.shape[0]), kb, vb, valid_b))
    return None, dq.astype(qb.dtype)

  _, dq = jax.lax.scan(dq_block, None, (qb, slots_b, lse, dout32, delta))

  def dkv_block(_, ys):
    j, k, v, valid = ys

    def q_block(carry, xs):
      q, slots, lse, do, delta = xs

      def update(carry):
        dk, dv = carry
        p, ds = tile(q, k, v, slots, valid, j * bk, lse, do, delta)
        dv = dv + jnp.einsum("bkgqc,bkgqd->bkcd", p, do, preferred_element_type=jnp.float32)
        dk = dk + jnp.einsum("bkgqc,bkgqd->bkcd", ds, q, preferred_element_type=jnp.float32) * scale
        return dk, dv

      return jax.lax.cond(_tile_live(slots, valid, j * bk), update, lambda c: c, carry), None

    zeros = jnp.zeros(k.shape, jnp.float32)
    (dk, dv), _ = jax.lax.scan(q_block, (zeros, zeros), (qb, slots_b, lse, dout32, delta))
    return None, (dk.astype(kb.dtype), dv.astype(vb.dtype))

  _, (dk, dv) = jax.lax.scan(dkv_block, None, (jnp.arange(kb.shape[0]), kb, vb, valid_b))
  return dq, dk, dv, None, None


_flash.defvjp(_flash_fwd, _flash_bwd)


# ------------------------------------------------------------------------------------------------------ measurement
def compiled_temp_bytes(impl: str, length: int, batch: int = 1, heads: int = 8, kv_heads: int = 2,
                        head_dim: int = 128) -> int:
  """XLA's temp bytes of a compiled (never run) value-and-grad of `impl` ("xla" or "blockwise") at T = S = length."""
  shapes = ((batch, length, heads, head_dim),) + ((batch, length, kv_heads, head_dim),) * 2
  args = [jax.ShapeDtypeStruct(shape, jnp.float32) for shape in shapes]
  mask = AttentionMask(jnp.ones((batch, length), bool))
  fn = {"xla": lambda q, k, v: dense_attention(q, k, v, mask.dense(length)),
        "blockwise": lambda q, k, v: blockwise_attention(q, k, v, mask)}[impl]
  step = jax.jit(jax.value_and_grad(lambda q, k, v: jnp.sum(fn(q, k, v)), argnums=(0, 1, 2)))
  return step.lower(*args).compile().memory_analysis().temp_size_in_bytes


if __name__ == "__main__":  # python -m sao.models.attention [length ...]: compiled memory, reference vs blockwise
  import sys
  for n in [int(a) for a in sys.argv[1:]] or [8192]:
    ref, blk = compiled_temp_bytes("xla", n), compiled_temp_bytes("blockwise", n)
    print(f"T={n} B=1 H=8 K=2 D=128 value+grad temp: xla {ref / 2**20:.1f} MiB, blockwise {blk / 2**20:.1f} MiB "
          f"({ref / blk:.0f}x) on {jax.default_backend()}")
