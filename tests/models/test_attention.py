"""sao.models.attention: blockwise and splash attention equal the reference (values and gradients), the selection
rule, the compiled memory of the blockwise path, and the model wired through `attention_impl`."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sao.models import attention as attn
from sao.models.config import ModelConfig
from sao.models.transformer import CausalLM, init_cache

ATOL = 2e-5


def _qkv(seed, b, t, s, h, kv, d, dtype=jnp.float32):
  rng = np.random.default_rng(seed)
  q = jnp.asarray(rng.normal(size=(b, t, h, d)), dtype)
  k = jnp.asarray(rng.normal(size=(b, s, kv, d)), dtype)
  v = jnp.asarray(rng.normal(size=(b, s, kv, d)), dtype)
  return q, k, v, rng


def _padding(kinds, t):
  """[len(kinds), T] key validity; row i is "left" / "right" padded by 5 + 6i tokens or "none"."""
  valid = np.ones((len(kinds), t), bool)
  for row, kind in enumerate(kinds):
    if kind == "left":
      valid[row, :5 + 6 * row] = False
    elif kind == "right":
      valid[row, t - 5 - 6 * row:] = False
  return valid


def _visible_queries(mask, t):
  """[B, T] bool: queries that see at least one key (the others' outputs are unspecified)."""
  return np.asarray(mask.dense(t).any(-1))


def _check_equal(q, k, v, mask, impl_fn, rng):
  """impl_fn(q, k, v) = reference on every query that sees a key; gradients of a loss over those queries too."""
  t = q.shape[1]
  seen = _visible_queries(mask, t)[:, :, None, None]
  ref_fn = jax.jit(lambda q, k, v: attn.reference_attention(q, k, v, mask.dense(t)))
  impl_fn = jax.jit(impl_fn)
  np.testing.assert_allclose(np.where(seen, impl_fn(q, k, v), 0), np.where(seen, ref_fn(q, k, v), 0), atol=ATOL)
  weights = jnp.asarray(rng.normal(size=q.shape), jnp.float32) * seen
  loss = lambda fn: (lambda q, k, v: jnp.sum(fn(q, k, v).astype(jnp.float32) * weights))
  got = jax.jit(jax.grad(loss(impl_fn), argnums=(0, 1, 2)))(q, k, v)
  want = jax.jit(jax.grad(loss(ref_fn), argnums=(0, 1, 2)))(q, k, v)
  for name, g, w in zip("qkv", got, want):
    np.testing.assert_allclose(g, w, atol=ATOL, err_msg=f"d{name}")


@pytest.mark.parametrize("heads,kv_heads", [(8, 2), (4, 4), (3, 1)])
def test_dense_equals_reference_training_layout(heads, kv_heads):
  """The "xla" path (query heads folded into rows) = the head-by-head oracle: left/right/no padding, GQA, MHA, MQA
  with an odd group; values and gradients."""
  q, k, v, rng = _qkv(11 + heads, 3, 23, 23, heads, kv_heads, 8)
  mask = attn.AttentionMask(jnp.asarray(_padding(("left", "right", "none"), 23)))
  _check_equal(q, k, v, mask, lambda q, k, v: attn.dense_attention(q, k, v, mask.dense(23)), rng)
  np.testing.assert_allclose(attn.attention(q, k, v, mask, "xla"), attn.dense_attention(q, k, v, mask.dense(23)))


def test_blockwise_equals_reference_causal_gqa_left_right_padding():
  # Rows left-padded, right-padded, unpadded; 37 tokens with 8-query / 16-key blocks: ragged last blocks on both
  # axes, skipped (future and all-padding) key tiles; GQA with 8 query heads on 2 kv heads.
  q, k, v, rng = _qkv(0, 3, 37, 37, 8, 2, 16)
  mask = attn.AttentionMask(jnp.asarray(_padding(("left", "right", "none"), 37)))
  _check_equal(q, k, v, mask, lambda q, k, v: attn.blockwise_attention(q, k, v, mask, block_q=8, block_k=16), rng)


_CACHED_IMPLS = {  # name -> (kv heads, attention of (q, k, v, mask))
    "dense": (2, lambda q, k, v, mask: attn.dense_attention(q, k, v, mask.dense(q.shape[1]))),
    "blockwise": (1, lambda q, k, v, mask: attn.blockwise_attention(q, k, v, mask, block_q=4, block_k=8)),
}


@pytest.mark.parametrize("impl", sorted(_CACHED_IMPLS))
def test_equals_reference_with_cache_slots(impl):
  """Decode (T = 1) and a prefill chunk (T = 5) against S = 29 cached slots: left-padded rows at different write
  offsets, invalid slots in the middle (a padded prompt chunk), future slots not yet written."""
  s = 29
  kv_heads, fn = _CACHED_IMPLS[impl]
  valid = np.zeros((2, s), bool)
  valid[0, 3:20], valid[1, 0:9], valid[1, 12:25] = True, True, True
  for t, index in ((1, np.array([19, 24])), (5, np.array([15, 20]))):
    q, k, v, rng = _qkv(t, 2, t, s, 4, kv_heads, 8)
    slots = jnp.asarray(index[:, None] + np.arange(t)[None, :], jnp.int32)
    mask = attn.AttentionMask(jnp.asarray(valid), slots)
    _check_equal(q, k, v, mask, lambda q, k, v: fn(q, k, v, mask), rng)


def test_blockwise_query_without_visible_key_is_zero_and_finite():
  q, k, v, _ = _qkv(3, 1, 6, 6, 2, 2, 4)
  valid = np.array([[False, False, True, True, True, True]])
  mask = attn.AttentionMask(jnp.asarray(valid))
  fn = lambda q, k, v: attn.blockwise_attention(q, k, v, mask, block_q=2, block_k=2)
  np.testing.assert_array_equal(jax.jit(fn)(q, k, v)[0, :2], 0.0)
  grads = jax.jit(jax.grad(lambda q, k, v: jnp.sum(fn(q, k, v)), argnums=(0, 1, 2)))(q, k, v)
  assert all(bool(jnp.all(jnp.isfinite(g))) for g in grads)


def test_blockwise_bfloat16_close_to_float32_reference():
  q, k, v, _ = _qkv(4, 1, 40, 40, 4, 2, 16)
  mask = attn.AttentionMask(jnp.asarray(_padding(("left",), 40)))
  seen = _visible_queries(mask, 40)[:, :, None, None]
  out = attn.blockwise_attention(*(x.astype(jnp.bfloat16) for x in (q, k, v)), mask, block_q=16, block_k=16)
  assert out.dtype == jnp.bfloat16
  want = attn.reference_attention(q, k, v, mask.dense(40))
  np.testing.assert_allclose(np.where(seen, out.astype(jnp.float32), 0), np.where(seen, want, 0), atol=5e-2)


def test_blockwise_backward_memory_far_below_reference():
  """Compiled (not run) value-and-grad at T = 4096: the reference keeps [B, K, G, T, T] float32 scores and
  probabilities; blockwise keeps per-tile arrays and per-block accumulators only."""
  t, heads = 4096, 2
  ref = attn.compiled_temp_bytes("xla", t, heads=heads, kv_heads=1, head_dim=32)
  blockwise = attn.compiled_temp_bytes("blockwise", t, heads=heads, kv_heads=1, head_dim=32)
  assert ref >= heads * t * t * 4  # the oracle really materialises [T, T]
  assert blockwise * 20 < ref, (blockwise, ref)


def test_blockwise_inside_a_scan_keeps_no_tile_of_every_block_pair():
  """Differentiated inside a `lax.scan` over layers (`model.scan_layers`), with the mask loop-invariant: no array of
  one tile per (query block, key block) pair, [nq, nk, ..., bq, bk], appears (JAX would hoist the invariant tile masks
  out of the scan: T² memory); the gradient is the one of the unscanned layers."""
  t, block = 1024, 256
  q = _qkv(0, 1, t, t, 2, 1, 16)[0]
  mask = attn.AttentionMask(jnp.asarray(_padding(["left"], t)))

  def layer(x):
    return attn.blockwise_attention(x, x[:, :, :1], x[:, :, :1], mask, block_q=block, block_k=block)

  def scanned(x):
    y, _ = jax.lax.scan(lambda c, _: (layer(c), None), x, None, length=2)
    return jnp.sum(y * y)

  jaxpr = jax.make_jaxpr(jax.grad(scanned))(q)
  n = t // block
  shapes = set()

  def walk(j):
    for eqn in j.eqns:
      shapes.update(tuple(v.aval.shape) for v in eqn.outvars if hasattr(v.aval, "shape"))
      for param in eqn.params.values():
        inner = getattr(param, "jaxpr", param)
        if hasattr(inner, "eqns"):
          walk(inner)
  walk(jaxpr.jaxpr)
  assert not [s for s in shapes if len(s) >= 4 and s[:2] == (n, n) and s[-2:] == (block, block)], shapes
  unrolled = jax.grad(lambda x: jnp.sum(layer(layer(x)) ** 2))(q)
  np.testing.assert_allclose(np.asarray(jax.grad(scanned)(q)), np.asarray(unrolled), rtol=1e-5, atol=1e-5)


def test_resolve_impl_rule():
  tpu = dict(backend="tpu", num_devices=1)
  assert attn.resolve_impl("auto", 4096, 4096, cached=False, **tpu) == "splash"
  assert attn.resolve_impl("auto", 4096, 4096, cached=False, backend="tpu", num_devices=8) == "splash"  # shard_map
  assert attn.resolve_impl("auto", 4096, 4096, cached=False, backend="tpu", num_devices=0) == "blockwise"  # unknown
  assert attn.resolve_impl("auto", 1, 131072, cached=True, **tpu) == "xla"  # a decode step: [1, S] scores
  assert attn.resolve_impl("auto", 2048, 4096, cached=True, **tpu) == "blockwise"  # a long prefill chunk
  assert attn.resolve_impl("auto", 100, 100, cached=False, **tpu) == "xla"  # not a multiple of 128
  assert attn.resolve_impl("auto", 256, 256, cached=False, backend="cpu") == "xla"
  assert attn.resolve_impl("auto", 2048, 2048, cached=False, backend="cpu") == "blockwise"
  assert attn.resolve_impl("auto", 2048, 2048, cached=False, backend="gpu") == "blockwise"
  assert attn.resolve_impl("xla", 8192, 8192, cached=False, **tpu) == "xla"
  assert attn.resolve_impl("splash", 8192, 8192, cached=False, backend="tpu", num_devices=8) == "splash"
  with pytest.raises(ValueError, match="attention_impl"):
    attn.resolve_impl("flash", 8, 8, cached=False)


def test_bad_inputs_raise():
  q, k, v, _ = _qkv(5, 1, 4, 4, 3, 2, 8)
  with pytest.raises(ValueError, match="K dividing H"):
    attn.attention(q, k, v, attn.AttentionMask(jnp.ones((1, 4), bool)))
  q, k, v, _ = _qkv(5, 1, 4, 6, 4, 2, 8)
  with pytest.raises(ValueError, match="T .4. must equal S .6."):
    attn.attention(q, k, v, attn.AttentionMask(jnp.ones((1, 6), bool)))
  with pytest.raises(ValueError, match="training layout"):
    attn.attention(q, k, v, attn.AttentionMask(jnp.ones((1, 6), bool), jnp.zeros((1, 4), jnp.int32)), "splash")
  with pytest.raises(ValueError, match="attention_impl"):
    ModelConfig(model_type="qwen3", vocab_size=8, hidden_size=8, intermediate_size=8, num_layers=1, num_heads=2,
                num_kv_heads=1, head_dim=4, attention_impl="flash")


def test_splash_equals_reference_in_interpret_mode():
  """The TPU kernel's construction (causal MultiHeadMask, MQA kernel per kv head, segment ids for padding, the
  1/sqrt(D) scaling) checked by running it through the Pallas interpreter on CPU: values and gradients."""
  pytest.importorskip("jax.experimental.pallas.ops.tpu.splash_attention")
  q, k, v, rng = _qkv(6, 1, 128, 128, 4, 2, 128)
  mask = attn.AttentionMask(jnp.asarray(_padding(("left",), 128)))
  _check_equal(q, k, v, mask, lambda q, k, v: attn.splash_attention(q, k, v, mask.key_valid, block=128,
                                                                    interpret=True), rng)


def test_splash_blocks_divide_any_length_auto_gives_it():
  """"auto" takes splash on a one-device TPU program for every length divisible by 128; its blocks must divide the
  length (640 with the default 512 blocks: 128), or the kernel is refused while the program is traced — on a CPU
  host too, which traces the TPU branch of the platform switch (a 640-token toy bucket failed this way)."""
  pytest.importorskip("jax.experimental.pallas.ops.tpu.splash_attention")
  assert attn.resolve_impl("auto", 640, 640, False, backend="tpu", num_devices=1) == "splash"
  q, k, v, rng = _qkv(8, 1, 640, 640, 2, 1, 16)
  mask = attn.AttentionMask(jnp.asarray(_padding(("left",), 640)))
  _check_equal(q, k, v, mask, lambda q, k, v: attn.splash_attention(q, k, v, mask.key_valid, interpret=True), rng)


def _tiny(impl, model_type="qwen3"):
  return ModelConfig(model_type=model_type, vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=2,
                     num_heads=4, num_kv_heads=2, head_dim=8, qk_norm=True, attention_impl=impl)


def test_model_blockwise_equals_xla_training_and_decode():
  """CausalLM with attention_impl='blockwise' = 'xla': logits of a left-padded batch, and a prefill + one decode
  step through the KV cache."""
  ids = jnp.asarray(np.random.default_rng(7).integers(0, 64, size=(2, 9)), jnp.int32)
  am = jnp.asarray([[0, 0, 1, 1, 1, 1, 1, 1, 1], [1] * 9], jnp.int32)
  xla, blockwise = CausalLM(_tiny("xla")), CausalLM(_tiny("blockwise"))
  params = xla.init(jax.random.PRNGKey(0), ids, am)
  real = np.asarray(am, bool)[:, :, None]

  @jax.jit
  def run(params, cache_x, cache_b):
    full = [model.apply(params, ids, am)[0] for model in (xla, blockwise)]
    steps = []
    for model, cache in ((xla, cache_x), (blockwise, cache_b)):
      _, cache = model.apply(params, ids[:, :8], am[:, :8], cache)
      steps.append(model.apply(params, ids[:, 8:], am[:, 8:], cache)[0])
    return full, steps

  (want, got), (step_x, step_b) = run(params, init_cache(xla.config, 2, 12), init_cache(blockwise.config, 2, 12))
  np.testing.assert_allclose(np.where(real, got, 0), np.where(real, want, 0), atol=1e-5)
  np.testing.assert_allclose(step_b, step_x, atol=1e-5)
