"""Pallas splash attention on TPU, the training layout (no KV cache, T = S): `sao.models.attention`'s "splash".

Causal mask plus segment ids for padding; GQA by running the MQA kernel once per kv head. The kernel is a
per-device Mosaic custom call, which XLA cannot partition (under a multi-device jit it would gather q/k/v onto every
device, or refuse), so `sharded_splash_attention` runs it in a `jax.shard_map` over the context mesh: each device
attends its own rows (B over the batch axes `data`, `fsdp`, `expert`, those dividing B) and its own heads (H over
`tensor` when `tensor` divides H), with no collective inside. When `tensor` does not divide the K KV heads, each KV
head is first repeated r = `kv_repeats(H, K, tensor)` times (as `attention.replicate_kv_heads` does for blockwise),
so that every chip holds the copies its query heads read; the gradient's sum over the copies is the transpose of
that repeat, one reduction per layer call outside the kernel.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from sao.models.mesh_axes import BATCH_AXES, TENSOR_AXIS, kv_repeats, logical_mesh_axes

Array = jax.Array
BLOCK = 512  # = sao.models.attention.BLOCK_Q


def splash_kernel(heads_per_kv: int, length: int, block: int = BLOCK, interpret: bool = False):
  """The Pallas splash-attention MQA kernel for one kv head: `heads_per_kv` query heads, causal over `length`.
  Its blocks are the largest size dividing both `block` and `length` (the kernel refuses a block that does not
  divide the sequence: a bucket of 640 tokens runs 128-token blocks).
  Not cached: built inside a trace, its mask arrays are that trace's values, and a kernel shared with a later trace
  leaks them (`UnexpectedTracerError`); building it preprocesses the mask block by block (seconds at 32k tokens)."""
  from jax.experimental.pallas.ops.tpu import splash_attention as splash  # TPU-only kernel; imported on use
  blk = math.gcd(block, length)
  sizes = splash.BlockSizes(block_q=blk, block_kv=blk, block_kv_compute=blk, block_q_dkv=blk, block_kv_dkv=blk,
                            block_kv_dkv_compute=blk, block_q_dq=blk, block_kv_dq=blk)
  mask = splash.MultiHeadMask([splash.CausalMask((length, length))] * heads_per_kv)
  return splash.make_splash_mqa_single_device(mask, block_sizes=sizes, interpret=interpret)


def splash_attention(q: Array, k: Array, v: Array, key_valid: Array, *, block: int = BLOCK,
                     interpret: bool = False) -> Array:
  """Splash attention on one device, training layout (T = S, query t at slot t). q: [B, T, H, D]; k, v: [B, T, K, D];
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


def splash_layout(mesh, batch: int, heads: int, kv_heads: int) -> tuple[P, P, P, int]:
  """How `sharded_splash_attention` splits its operands over `mesh`'s non-manual axes: (q / output spec
  [B, T, H, D], k / v spec [B, T, K·r, D], key_valid spec [B, T], r the KV-head repeat count)."""
  free = {a: int(n) for a, n in mesh.shape.items() if a not in mesh.manual_axes}
  rows = logical_mesh_axes(("batch",), (batch,), free, (("batch", BATCH_AXES),))[0]
  tensor = free.get(TENSOR_AXIS, 1)
  head_axis = TENSOR_AXIS if tensor > 1 and heads % tensor == 0 else None
  repeats = kv_repeats(heads, kv_heads, tensor) if head_axis else 1
  return P(rows, None, head_axis, None), P(rows, None, head_axis, None), P(rows, None), repeats


def sharded_splash_attention(q: Array, k: Array, v: Array, key_valid: Array, *, block: int = BLOCK,
                             interpret: bool = False) -> Array:
  """`splash_attention` under the context mesh (`jax.set_mesh`): one `jax.shard_map` over its non-manual axes with
  the layout of `splash_layout` (module docstring), each device running the kernel on its [B_local, T, H_local, D]
  block. Without a mesh, on one device or inside a shard_map manual over every axis, the kernel runs directly.
  Same arguments and result as `splash_attention`."""
  mesh = jax.sharding.get_abstract_mesh()
  run = lambda q, k, v, valid: splash_attention(q, k, v, valid, block=block, interpret=interpret)
  if mesh.empty or mesh.size == 1 or set(mesh.manual_axes) == set(mesh.axis_names):
    return run(q, k, v, key_valid)
  q_spec, kv_spec, valid_spec, repeats = splash_layout(mesh, q.shape[0], q.shape[2], k.shape[2])
  if repeats > 1:
    k, v = jnp.repeat(k, repeats, axis=2), jnp.repeat(v, repeats, axis=2)
  free = set(mesh.axis_names) - set(mesh.manual_axes)
  # check_vma=False: the kernel's pallas_calls declare no varying mesh axes for their outputs, which check_vma=True
  # requires ("`manual_axis_type` on `jax.ShapeDtypeStruct` must not be `None`", jax 0.10.2). Nothing here needs it:
  # the body has no collective, and an axis the specs leave out holds the same values on every device.
  return jax.shard_map(run, mesh=mesh, in_specs=(q_spec, kv_spec, kv_spec, valid_spec), out_specs=q_spec,
                       axis_names=free, check_vma=False)(q, k, v, key_valid)
