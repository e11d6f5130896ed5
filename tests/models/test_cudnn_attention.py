"""Attention on GPU (`sao.models.cudnn_attention`) and the choice by lowering platform (`attention.platform_impls`).

No GPU here: the cuDNN kernel's arguments are checked on CPU through the same `jax.nn.dot_product_attention` call
with JAX's reference implementation, and the GPU programs are lowered for `cuda` (not run) from this CPU host. JAX
traces its cuDNN kernel only where its CUDA plugin reports a cuDNN version; `_with_cudnn` stands in for that one
query (a GPU host's cuDNN 9.x) so that the lowering a GPU host would produce can be inspected here.
"""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sao.models import attention as attn
from sao.models import cudnn_attention as cud
from sao.models.config import ModelConfig
from sao.models.transformer import CausalLM, init_params

CUDNN_CALL = "__cudnn$fmhaSoftmax"


@pytest.fixture
def with_cudnn(monkeypatch):
  from jax._src.cudnn import fused_attention_stablehlo as fused
  monkeypatch.setattr(fused, "check_cudnn_version", lambda: 91000)


def _qkv(b, t, h, kv, d, dtype=jnp.float32, seed=0):
  keys = jax.random.split(jax.random.PRNGKey(seed), 3)
  return (jax.random.normal(keys[0], (b, t, h, d), dtype), jax.random.normal(keys[1], (b, t, kv, d), dtype),
          jax.random.normal(keys[2], (b, t, kv, d), dtype))


def _valid_close(got, want, key_valid, atol):
  rows = np.asarray(key_valid, bool)  # real queries only: a padding query's output is unspecified by contract
  np.testing.assert_allclose(np.asarray(got, np.float32)[rows], np.asarray(want, np.float32)[rows], atol=atol)


def test_keys_are_prefix():
  assert bool(cud.keys_are_prefix(jnp.array([[1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]], bool)))
  assert not bool(cud.keys_are_prefix(jnp.array([[1, 1, 0, 0], [0, 1, 1, 1]], bool)))  # left padding
  assert not bool(cud.keys_are_prefix(jnp.array([[1, 0, 1, 0]], bool)))  # a gap


def test_valid_first_orders_and_restores():
  valid = jnp.array([[0, 1, 0, 1, 1], [1, 1, 1, 0, 0]], bool)
  order, inverse = cud.valid_first(valid)
  np.testing.assert_array_equal(order, [[1, 3, 4, 0, 2], [0, 1, 2, 3, 4]])
  x = jnp.arange(10).reshape(2, 5)
  np.testing.assert_array_equal(jnp.take_along_axis(jnp.take_along_axis(x, order, 1), inverse, 1), x)


@pytest.mark.parametrize("masks", ["right", "left", "gaps"])
def test_causal_call_equals_the_reference_under_any_mask(masks):
  """Right padding (an empty row too) runs the causal-only call as it is; left padding and gaps run it on rows
  reordered valid-first. Both equal the reference on real queries, values and gradients, and stay finite. The call
  is `cudnn_causal`'s, on JAX's reference path (no cuDNN on CPU)."""
  q, k, v = _qkv(3, 24, 4, 2, 16)
  t = np.arange(24)
  valid = {"right": np.stack([t < 24, t < 9, t < 0]),
           "left": np.stack([t >= 0, t >= 15, t >= 7]),
           "gaps": np.stack([t % 3 != 1, (t < 5) | (t > 12), t >= 20])}[masks]
  mask = attn.AttentionMask(jnp.asarray(valid))

  def ours(q, k, v):
    return cud.cudnn_attention(q, k, v, mask.key_valid, implementation="xla")

  def reference(q, k, v):
    return attn.reference_attention(q, k, v, mask.dense(24))

  assert bool(cud.keys_are_prefix(mask.key_valid)) == (masks == "right")
  _valid_close(ours(q, k, v), reference(q, k, v), valid, 2e-5)
  weights = jnp.asarray(valid, jnp.float32)[:, :, None, None]  # a loss on real queries only
  grads = [jax.grad(lambda *x, f=f: jnp.sum(f(*x) * weights * v[..., :1].mean()), argnums=(0, 1, 2))(q, k, v)
           for f in (ours, reference)]
  for got, want in zip(*grads):
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=2e-5)
  assert np.isfinite(np.asarray(ours(q, k, v))).all()


def test_unusable_reasons(with_cudnn):
  bf16 = jax.ShapeDtypeStruct((1, 128, 8, 128), jnp.bfloat16)
  kv = jax.ShapeDtypeStruct((1, 128, 2, 128), jnp.bfloat16)
  assert cud.cudnn_unusable_reason(bf16, kv, cached=False) is None
  assert "KV-cache" in cud.cudnn_unusable_reason(bf16, kv, cached=True)
  f32 = jax.ShapeDtypeStruct((1, 128, 8, 128), jnp.float32)
  assert "dtype float32" in cud.cudnn_unusable_reason(f32, f32, cached=False)
  odd = jax.ShapeDtypeStruct((1, 128, 8, 12), jnp.bfloat16)
  assert "head dim 12" in cud.cudnn_unusable_reason(odd, odd, cached=False)
  assert "head dim 512" in cud.cudnn_unusable_reason(*(jax.ShapeDtypeStruct((1, 128, 8, 512), jnp.bfloat16),) * 2,
                                                     cached=False)


def test_without_cudnn_on_the_host_the_reason_says_so():
  if cud._cudnn_version() is not None:
    pytest.skip("this host has JAX's CUDA plugin")
  bf16 = jax.ShapeDtypeStruct((1, 128, 8, 128), jnp.bfloat16)
  assert "no cuDNN on this host" in cud.cudnn_unusable_reason(bf16, bf16, cached=False)


def test_platform_impls(with_cudnn):
  q = jax.ShapeDtypeStruct((1, 4096, 16, 128), jnp.bfloat16)
  k = jax.ShapeDtypeStruct((1, 4096, 8, 128), jnp.bfloat16)
  got = attn.platform_impls("auto", q, k, cached=False)
  assert got["cuda"] == "cudnn" and got["cpu"] == "blockwise" and got["rocm"] == "blockwise"
  assert got["tpu"] == "blockwise"  # no mesh, not a TPU host: the target's device count is unknown, no splash
  with jax.set_mesh(jax.make_mesh((1,), ("data",), devices=jax.devices()[:1])):
    assert attn.platform_impls("auto", q, k, cached=False)["tpu"] == "splash"  # a one-chip program
  with jax.set_mesh(jax.make_mesh((2,), ("data",), devices=jax.devices()[:2])):
    assert attn.platform_impls("auto", q, k, cached=False)["tpu"] == "blockwise"  # CPU devices: no TPU branch
  short = attn.platform_impls("auto", jax.ShapeDtypeStruct((1, 1, 16, 128), jnp.bfloat16), k, cached=True)
  assert set(short.values()) == {"xla"}  # a decode step: no cuDNN, no splash
  assert set(attn.platform_impls("blockwise", q, k, cached=False).values()) == {"blockwise"}


def _bf16_model(model_type="qwen3"):
  config = dataclasses.replace(ModelConfig.tiny(model_type), dtype="bfloat16")
  params = init_params(config, jax.random.PRNGKey(0))
  ids = jax.ShapeDtypeStruct((2, 128), jnp.int32)
  mask = jax.ShapeDtypeStruct((2, 128), jnp.int32)

  def loss(params, ids, mask):
    logits, _ = CausalLM(config).apply({"params": params}, ids, mask)
    return jnp.mean(logits.astype(jnp.float32))

  forward = jax.jit(lambda p, i, m: CausalLM(config).apply({"params": p}, i, m)[0]).trace(params, ids, mask)
  backward = jax.jit(jax.grad(loss)).trace(params, ids, mask)
  return forward, backward


def test_model_lowered_for_cuda_uses_cudnn_and_for_cpu_keeps_its_path(with_cudnn):
  """The bf16 model's forward and gradient, traced once: lowered for cuda they hold cuDNN's fused attention (forward
  and backward kernels, in both branches of the right-padding cond) and no ragged dot; lowered for cpu, no cuDNN
  call, and the same values as attention_impl='xla'."""
  forward, backward = _bf16_model()
  for traced, calls in ((forward, (CUDNN_CALL,)), (backward, (CUDNN_CALL, CUDNN_CALL + "Backward"))):
    cuda = traced.lower(lowering_platforms=("cuda",)).as_text()
    assert all(call in cuda for call in calls)
    cpu = traced.lower(lowering_platforms=("cpu",)).as_text()
    assert "cudnn" not in cpu and "fmha" not in cpu
  # the cpu program computes what it computed before the platform switch: the same values as attention_impl='xla'
  config = ModelConfig.tiny("qwen3")
  params = init_params(config, jax.random.PRNGKey(0))
  ids = jnp.arange(2 * 128, dtype=jnp.int32).reshape(2, 128) % config.vocab_size
  mask = jnp.ones((2, 128), jnp.int32).at[1, 100:].set(0)
  auto = CausalLM(config).apply({"params": params}, ids, mask)[0]
  xla = CausalLM(dataclasses.replace(config, attention_impl="xla")).apply({"params": params}, ids, mask)[0]
  np.testing.assert_array_equal(np.asarray(auto), np.asarray(xla))


def test_model_lowered_for_cuda_without_cudnn_falls_back():
  if cud._cudnn_version() is not None:
    pytest.skip("this host has JAX's CUDA plugin")
  forward, _ = _bf16_model()
  assert "cudnn" not in forward.lower(lowering_platforms=("cuda",)).as_text()


def test_moe_model_lowered_for_cuda_has_no_ragged_dot(with_cudnn):
  """The routed MoE lowered for cuda runs the tiled grouped matmul (forward and gradient), never XLA's ragged dot,
  which XLA:GPU computes dense over the experts; for tpu the ragged dot stays (the GSPMD kernel there)."""
  _, backward = _bf16_model("qwen3_moe")
  cuda = backward.lower(lowering_platforms=("cuda",)).as_text()
  assert "ragged_dot" not in cuda and CUDNN_CALL in cuda
  assert "ragged_dot" in backward.lower(lowering_platforms=("tpu",)).as_text()
