"""Pallas splash attention on TPU, the training layout (no KV cache, T = S): `sao.models.attention`'s "splash".

Causal mask plus segment ids for padding; GQA by running the MQA kernel once per kv head. A per-device Mosaic kernel:
under a multi-device jit XLA cannot partition it (the module docstring of `sao.models.attention` says where "auto"
uses it).
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp

Array = jax.Array
BLOCK = 512  # = sao.models.attention.BLOCK_Q


def splash_kernel(heads_per_kv: int, length: int, block: int = BLOCK, interpret: bool = False):
  """The Pallas splash-attention MQA kernel for one kv head: `heads_per_kv` query heads, causal over `length`.
  Its blocks are the largest size dividing both `block` and `length` (the kernel refuses a block that does not
  divide the sequence: a bucket of 640 tokens runs 128-token blocks)."""
  from jax.experimental.pallas.ops.tpu import splash_attention as splash  # TPU-only kernel; imported on use
  blk = math.gcd(block, length)
  sizes = splash.BlockSizes(block_q=blk, block_kv=blk, block_kv_compute=blk, block_q_dkv=blk, block_kv_dkv=blk,
                            block_kv_dkv_compute=blk, block_q_dq=blk, block_kv_dq=blk)
  mask = splash.MultiHeadMask([splash.CausalMask((length, length))] * heads_per_kv)
  return splash.make_splash_mqa_single_device(mask, block_sizes=sizes, interpret=interpret)


def splash_attention(q: Array, k: Array, v: Array, key_valid: Array, *, block: int = BLOCK,
                     interpret: bool = False) -> Array:
  """Splash attention, training layout (T = S, query t at slot t). q: [B, T, H, D]; k, v: [B, T, K, D];
  key_valid: [B, T]. Padding is a segment id (real 1, padding 0): real queries see only real keys, and a padding
  query sees causal padding keys (at least itself), so no softmax row is empty."""
  from jax.experimental.pallas.ops.tpu.splash_attention import SegmentIds
  b, t, h, d = q.shape
  kv_heads = k.shape[2]
  kernel = splash_kernel(h // kv_heads, t, block, interpret)
  seg = key_valid.astype(jnp.int32)
  qs = (q * (d ** -0.5)).astype(q.dtype).reshape(b, t, kv_heads, h // kv_heads, d).transpose(0, 2, 3, 1, 4)
  ks, vs = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)  # [B, K, T, D]

  def one_row(q_row, k_row, v_row, seg_row):  # [K, G, T, D], [K, T, D], [K, T, D], [T]
    ids = SegmentIds(q=seg_row, kv=seg_row)
    return jax.vmap(lambda qh, kh, vh: kernel(qh, kh, vh, segment_ids=ids))(q_row, k_row, v_row)

  out = jax.vmap(one_row)(qs, ks, vs, seg)  # [B, K, G, T, D]
  return out.transpose(0, 3, 1, 2, 4).reshape(b, t, h, d).astype(v.dtype)
