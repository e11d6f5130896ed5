"""Causal GQA attention on NVIDIA GPUs through cuDNN's fused flash-attention kernel, with sao's masks kept exact.

`cudnn_attention(q, k, v, key_valid)`: q [B, T, H, D]; k, v [B, T, K, D] (training layout: no KV cache,
S = T); key_valid [B, T] bool. Same contract as `sao.models.attention.attention` (module docstring there):

    visible[b, t, s] = s <= t ∧ key_valid[b, s]

cuDNN (`jax.nn.dot_product_attention(implementation="cudnn")`) takes a causal mask, per-row sequence lengths and
an additive bias, not an arbitrary key-validity mask. When every row's valid keys are a prefix (right padding, what
`sao.train.batching` builds), `is_causal` alone is exact for every real query: query t < n_b sees keys s <= t, all
valid. Any other mask (left padding, gaps) is made such a prefix: each row's tokens are reordered, valid ones first
in their order (a stable argsort of the mask), attended causally, and the outputs put back. A real query then sees
exactly the valid keys before it, in the same order (attention does not depend on where they sit: RoPE was applied
before). A `lax.cond` on "every row is a prefix already" skips the reordering (four gathers) in the learner's case;
both branches are the same cuDNN kernel. Padding queries attend causally to keys of their own row: finite, and
unused by contract. Sequence lengths are not passed: a row with no real token would then have queries that see
nothing, which cuDNN is not documented to keep finite.

Where cuDNN cannot run, `cudnn_unusable_reason` says why (`sao.models.attention` then keeps its jnp path):
- a KV cache (decode / chunked prefill): per-query cache slots are not a causal mask cuDNN can take;
- dtype other than bfloat16 / float16 (cuDNN's flash kernels), or q / k / v of different dtypes;
- head dim not a multiple of 8, or above 128 (256 on Hopper and later; JAX's own check);
- no cuDNN on this host: JAX traces the kernel only where its CUDA plugin reports a cuDNN version, so a CPU host
  lowering for `cuda` (an ahead-of-time compile, the tests) cannot stage it;
- any other constraint JAX's cuDNN wrapper raises for at trace time (its message is the reason).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array
CUDNN_DTYPES = (jnp.bfloat16, jnp.float16)


def _cudnn_version() -> int | None:
  """cuDNN's version as JAX's wrapper sees it, or None where JAX has no CUDA plugin (it raises "cuDNN is not
  detected" then)."""
  try:
    from jax._src.cudnn import fused_attention_stablehlo as fused  # pylint: disable=g-import-not-at-top
    return int(fused.check_cudnn_version())
  except (ImportError, RuntimeError):
    return None


def _max_head_dim() -> int:
  """JAX's bound on the head dim: 256 on compute capability >= 9.0 (Hopper), else 128."""
  try:
    from jax._src.cudnn import fused_attention_stablehlo as fused  # pylint: disable=g-import-not-at-top
    return 256 if fused.check_compute_capability("9.0") else 128
  except Exception:  # pylint: disable=broad-except  (no GPU backend to ask: the bound every GPU accepts)
    return 128


def cudnn_unusable_reason(q, k, cached: bool) -> str | None:
  """Why cuDNN cannot run attention of these (abstract) operands, or None when it can (module docstring)."""
  if cached or q.shape[1] != k.shape[1]:
    return "KV-cache layout (per-query cache slots): cuDNN takes only a causal mask"
  if q.dtype != k.dtype or not any(q.dtype == d for d in CUDNN_DTYPES):
    return f"dtype {q.dtype} (q) / {k.dtype} (k, v): cuDNN's flash attention runs bfloat16 or float16 only"
  head_dim = q.shape[-1]
  if head_dim % 8 or head_dim > _max_head_dim():
    return f"head dim {head_dim}: cuDNN needs a multiple of 8, at most {_max_head_dim()}"
  if _cudnn_version() is None:
    return "no cuDNN on this host (JAX's CUDA plugin absent), so its kernel cannot be traced here"
  try:
    jax.eval_shape(lambda q, k: cudnn_causal(q, k, k), jax.ShapeDtypeStruct(q.shape, q.dtype),
                   jax.ShapeDtypeStruct(k.shape, k.dtype))
  except (NotImplementedError, ValueError, RuntimeError) as e:
    return f"JAX's cuDNN wrapper: {str(e)[:200]}"
  return None


def keys_are_prefix(key_valid: Array) -> Array:
  """Scalar bool: in every row the valid keys come first (no valid key after an invalid one). key_valid: [B, S]."""
  valid = key_valid.astype(bool)
  return jnp.all(valid[:, 1:] <= valid[:, :-1])


def cudnn_causal(q: Array, k: Array, v: Array, implementation: str = "cudnn") -> Array:
  """`jax.nn.dot_product_attention` with a causal mask only, scale 1/sqrt(D), GQA by the head counts.
  q [B, T, H, D], k, v [B, T, K, D] → [B, T, H, D] in v's dtype. `implementation="xla"` is the same call on
  JAX's reference path (the tests check the argument mapping with it on CPU)."""
  return jax.nn.dot_product_attention(q, k, v, is_causal=True, scale=q.shape[-1] ** -0.5,
                                      implementation=implementation).astype(v.dtype)


def valid_first(key_valid: Array) -> tuple[Array, Array]:
  """(order [B, T], inverse [B, T]) int32: `order[b]` lists row b's valid slots in order, then its invalid ones (a
  stable sort), `inverse` puts them back: x[order][inverse] = x."""
  order = jnp.argsort(~key_valid.astype(bool), axis=1, stable=True).astype(jnp.int32)
  return order, jnp.argsort(order, axis=1).astype(jnp.int32)


def cudnn_attention(q: Array, k: Array, v: Array, key_valid: Array, implementation: str = "cudnn") -> Array:
  """Causal attention under any key-validity mask through the causal-only kernel (module docstring): q [B, T, H, D],
  k, v [B, T, K, D], key_valid [B, T] → [B, T, H, D]."""
  def direct(q, k, v):
    return cudnn_causal(q, k, v, implementation)

  def reordered(q, k, v):
    order, inverse = valid_first(key_valid)
    take = lambda x, rows: jnp.take_along_axis(x, rows[:, :, None, None], axis=1)
    return take(direct(take(q, order), take(k, order), take(v, order)), inverse)

  return jax.lax.cond(keys_are_prefix(key_valid), direct, reordered, q, k, v)
